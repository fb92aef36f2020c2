// Stand-in for <CoreFoundation/CoreFoundation.h>. On macOS it brings in libdispatch and
// <math.h>, and metal-cpp relies on that.
#pragma once
#include <dispatch/dispatch.h>
#include <math.h>
#include <stdint.h>
typedef double CFTimeInterval;
typedef const void* CFTypeRef;
typedef const struct __CFString* CFStringRef;
typedef long CFIndex;
#ifdef __cplusplus
extern "C" {
#endif
CFTimeInterval CACurrentMediaTime(void);
#ifdef __cplusplus
}
#endif
