// Stand-in for <objc/message.h>. metal-cpp casts these to the right function type before
// calling them; the fake runtime's trampolines forward every register argument unchanged.
#pragma once
#include <objc/runtime.h>
#ifdef __cplusplus
extern "C" {
#endif
void objc_msgSend(void);
void objc_msgSend_fpret(void);
void objc_msgSend_stret(void);
#ifdef __cplusplus
}
#endif
