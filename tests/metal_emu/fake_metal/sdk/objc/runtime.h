// Stand-in for the Apple SDK's <objc/runtime.h>: only what metal-cpp uses. The functions are
// implemented by the fake Objective-C runtime (fake_metal/objc_runtime.cpp).
#pragma once
#ifdef __cplusplus
extern "C" {
#endif
typedef struct objc_class* Class;
typedef struct objc_object {
  Class isa;
}* id;
typedef struct objc_selector* SEL;
typedef void (*IMP)(void);
typedef signed char BOOL;
#define YES ((BOOL)1)
#define NO ((BOOL)0)
#ifndef nil
#define nil nullptr
#endif
Class objc_lookUpClass(const char* name);
void* objc_getProtocol(const char* name);
SEL sel_registerName(const char* name);
const char* sel_getName(SEL sel);
#ifdef __cplusplus
}
#endif
