// Stand-in for <TargetConditionals.h>: the fake platform is macOS.
#pragma once
#define TARGET_OS_MAC 1
#define TARGET_OS_OSX 1
#define TARGET_OS_IPHONE 0
#define TARGET_OS_IOS 0
#define TARGET_OS_TV 0
#define TARGET_OS_WATCH 0
#define TARGET_OS_SIMULATOR 0
// The deployment target that Apple's clang would define from -mmacosx-version-min
// (macOS 14, the project's minimum); metal-cpp's MTL::CopyAllDevices needs it.
#ifndef __MAC_OS_X_VERSION_MIN_REQUIRED
#define __MAC_OS_X_VERSION_MIN_REQUIRED 140000
#endif
