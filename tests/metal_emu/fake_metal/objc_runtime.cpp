// objc_runtime.cpp -- a tiny Objective-C runtime, just what metal-cpp calls:
// sel_registerName, objc_lookUpClass, objc_getProtocol, objc_msgSend(_stret/_fpret).
//
// objc_msgSend is an x86-64 trampoline: it saves the argument registers, asks
// msl_emu_objc_lookup for the method, restores the registers and tail-jumps, so the method
// sees exactly the arguments (registers and stack) that metal-cpp passed. A selector that the
// fake doesn't implement aborts with "[-MTLDevice foo:] not implemented by the fake Metal
// runtime": better a clear stop than a silently wrong answer.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "install.h"
#include "objc.h"

#if !defined(__x86_64__)
#error "the fake Objective-C runtime's objc_msgSend trampolines are written for x86-64"
#endif

extern "C" {
// What MTLSTR()/CFSTR() constants point their isa at (see is_const_string).
__attribute__((visibility("default"))) void* __CFConstantStringClassReference[4] = {};
}

namespace fake_objc {
namespace {

struct State {
  std::recursive_mutex mu;
  std::unordered_set<std::string> selectors;  // node-based: element addresses are stable
  std::unordered_map<std::string, Class*> classes;
};
State& state() {
  static State* s = new State();  // never destroyed: objects may be released during exit
  return *s;
}

Class* new_class_locked(const std::string& name) {
  Class* meta = new Class();
  meta->name = name;
  meta->is_meta = true;
  Class* c = new Class();
  c->name = name;
  c->isa = meta;
  state().classes[name] = c;
  return c;
}

void ensure_installed() {
  static std::once_flag once;
  std::call_once(once, [] {
    Class* root = cls("NSObject");
    root->isa->super = root;  // as in Objective-C: class objects inherit the root's instance methods
    install_root();
    install_foundation();
    install_device();
    install_library();
    install_buffer();
    install_commands();
  });
}

// Per-thread stack of autorelease pools (each a list of objects to release).
struct PoolFrame {
  Object* pool;
  std::vector<Object*> objects;
};
thread_local std::vector<PoolFrame> tls_pools;

}  // namespace

SEL sel(const char* name) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> l(s.mu);
  return (SEL)s.selectors.insert(name).first->c_str();
}

Class* cls(const char* name) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> l(s.mu);
  auto it = s.classes.find(name);
  if (it != s.classes.end()) return it->second;
  Class* c = new_class_locked(name);
  if (std::strcmp(name, "NSObject") != 0) {
    Class* root = cls("NSObject");
    c->super = root;
    c->isa->super = root->isa;
  }
  return c;
}

Class* define_class(const char* name, const char* super_name) {
  Class* c = cls(name);
  Class* s = cls(super_name);
  c->super = s;
  c->isa->super = s->isa;
  return c;
}

void add_method(Class* c, bool class_method, const char* selector, IMP imp) {
  (class_method ? c->isa : c)->methods[sel(selector)] = imp;
}

bool is_const_string(const void* p) { return p && *(void* const*)p == (void*)__CFConstantStringClassReference; }

void retain(Object* o) {
  if (o && !is_const_string(o)) o->refs.fetch_add(1, std::memory_order_relaxed);
}

void release(Object* o) {
  if (!o || is_const_string(o)) return;
  if (o->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete o;
}

Object* autorelease(Object* o) {
  if (!o || is_const_string(o)) return o;
  // Without a pool the object leaks, as Foundation does ("just leaking").
  if (!tls_pools.empty()) tls_pools.back().objects.push_back(o);
  return o;
}

void push_pool(Object* pool) { tls_pools.push_back({pool, {}}); }

void drain_pool(Object* pool) {
  // Draining a pool also drains every pool pushed after it, as in Foundation.
  while (!tls_pools.empty()) {
    PoolFrame f = std::move(tls_pools.back());
    tls_pools.pop_back();
    for (Object* o : f.objects) release(o);
    if (f.pool == pool) break;
  }
}

IMP find_in_class(Class* c, SEL selector, std::string* describe) {
  ensure_installed();
  for (Class* k = c; k; k = k->super) {
    auto it = k->methods.find(selector);
    if (it != k->methods.end()) return it->second;
  }
  if (describe) *describe = std::string("[") + (c->is_meta ? "+" : "-") + c->name + " " + (const char*)selector + "]";
  return nullptr;
}

IMP find_method(const void* receiver, SEL selector, std::string* describe) {
  ensure_installed();
  Class* c = is_const_string(receiver) ? cls("NSString") : ((const Object*)receiver)->isa;
  return find_in_class(c, selector, describe);
}

}  // namespace fake_objc

extern "C" {
using fake_objc::cls;
using fake_objc::ensure_installed;
using fake_objc::sel;

SEL sel_registerName(const char* name) { return sel(name); }
const char* sel_getName(SEL s) { return (const char*)s; }

::Class objc_lookUpClass(const char* name) {
  ensure_installed();
  return (::Class)cls(name);
}

// Protocols are only compared by metal-cpp, never messaged: a distinct object per name will do.
void* objc_getProtocol(const char* name) {
  ensure_installed();
  static std::mutex mu;
  static auto* protocols = new std::unordered_map<std::string, fake_objc::Object*>();
  std::lock_guard<std::mutex> l(mu);
  fake_objc::Object*& p = (*protocols)[name];
  if (!p) p = fake_objc::make<fake_objc::Object>("Protocol");
  return p;
}

// Called by the trampolines (hidden: a direct call from the asm, also inside a shared object).
__attribute__((visibility("hidden"))) IMP msl_emu_objc_lookup(const void* receiver, SEL selector) {
  std::string what;
  IMP imp = fake_objc::find_method(receiver, selector, &what);
  if (imp) return imp;
  fprintf(stderr, "%s not implemented by the fake Metal runtime\n", what.c_str());
  fflush(stderr);
  abort();
}

// For tests: the same lookup without aborting. Returns 1 if implemented; otherwise 0 and
// the diagnostic that objc_msgSend would print in *message (a static buffer).
__attribute__((visibility("default"))) int msl_emu_objc_responds(const char* class_name, int class_method,
                                                                  const char* selector, const char** message) {
  ensure_installed();
  fake_objc::Class* c = cls(class_name);
  std::string what;
  IMP imp = fake_objc::find_in_class(class_method ? c->isa : c, sel(selector), &what);
  static thread_local std::string msg;
  msg = what + " not implemented by the fake Metal runtime";
  if (message) *message = imp ? "" : msg.c_str();
  return imp != nullptr;
}

// For tests: every (class, selector) the fake implements, one "Class +sel" / "Class -sel" per line.
__attribute__((visibility("default"))) const char* msl_emu_objc_method_list() {
  ensure_installed();
  static std::string out;
  std::lock_guard<std::recursive_mutex> l(fake_objc::state().mu);
  out.clear();
  for (auto& [name, c] : fake_objc::state().classes) {
    for (auto& [s, imp] : c->isa->methods) out += name + " +" + (const char*)s + "\n";
    for (auto& [s, imp] : c->methods) out += name + " -" + (const char*)s + "\n";
  }
  return out.c_str();
}

}  // extern "C"

// Trampolines. On entry: rdi = receiver, rsi = selector (for _stret: rdi = result pointer,
// rsi = receiver, rdx = selector); rax = number of vector registers of a variadic call.
// The 192-byte frame keeps rsp 16-byte aligned for the lookup call.
#define MSL_EMU_SAVE_ARGS \
  "  pushq %rbp\n  movq %rsp, %rbp\n  subq $192, %rsp\n" \
  "  movq %rdi, 0(%rsp)\n  movq %rsi, 8(%rsp)\n  movq %rdx, 16(%rsp)\n  movq %rcx, 24(%rsp)\n" \
  "  movq %r8, 32(%rsp)\n  movq %r9, 40(%rsp)\n  movq %rax, 48(%rsp)\n" \
  "  movdqu %xmm0, 56(%rsp)\n  movdqu %xmm1, 72(%rsp)\n  movdqu %xmm2, 88(%rsp)\n  movdqu %xmm3, 104(%rsp)\n" \
  "  movdqu %xmm4, 120(%rsp)\n  movdqu %xmm5, 136(%rsp)\n  movdqu %xmm6, 152(%rsp)\n  movdqu %xmm7, 168(%rsp)\n"
#define MSL_EMU_RESTORE_ARGS_AND_JUMP \
  "  movq %rax, %r11\n" \
  "  movq 0(%rsp), %rdi\n  movq 8(%rsp), %rsi\n  movq 16(%rsp), %rdx\n  movq 24(%rsp), %rcx\n" \
  "  movq 32(%rsp), %r8\n  movq 40(%rsp), %r9\n  movq 48(%rsp), %rax\n" \
  "  movdqu 56(%rsp), %xmm0\n  movdqu 72(%rsp), %xmm1\n  movdqu 88(%rsp), %xmm2\n  movdqu 104(%rsp), %xmm3\n" \
  "  movdqu 120(%rsp), %xmm4\n  movdqu 136(%rsp), %xmm5\n  movdqu 152(%rsp), %xmm6\n  movdqu 168(%rsp), %xmm7\n" \
  "  leave\n  jmp *%r11\n"

// A message to nil returns zero (integer, pointer, float and two-register struct results);
// objc_msgSend_stret to nil leaves the caller's result memory as it was, as on macOS x86-64.
asm(".text\n"
    ".globl objc_msgSend\n.type objc_msgSend,@function\n"
    ".globl objc_msgSend_fpret\n.type objc_msgSend_fpret,@function\n"
    "objc_msgSend:\n"
    "objc_msgSend_fpret:\n"
    "  testq %rdi, %rdi\n  jz 1f\n"
    MSL_EMU_SAVE_ARGS
    "  call msl_emu_objc_lookup@PLT\n"
    MSL_EMU_RESTORE_ARGS_AND_JUMP
    "1:\n  xorl %eax, %eax\n  xorl %edx, %edx\n  pxor %xmm0, %xmm0\n  pxor %xmm1, %xmm1\n  ret\n"
    ".size objc_msgSend,.-objc_msgSend\n"
    ".size objc_msgSend_fpret,.-objc_msgSend_fpret\n"
    ".globl objc_msgSend_stret\n.type objc_msgSend_stret,@function\n"
    "objc_msgSend_stret:\n"
    "  testq %rsi, %rsi\n  jz 2f\n"
    MSL_EMU_SAVE_ARGS
    "  movq %rsi, %rdi\n  movq %rdx, %rsi\n"
    "  call msl_emu_objc_lookup@PLT\n"
    MSL_EMU_RESTORE_ARGS_AND_JUMP
    "2:\n  movq %rdi, %rax\n  ret\n"
    ".size objc_msgSend_stret,.-objc_msgSend_stret\n"
    ".section .note.GNU-stack,\"\",@progbits\n"
    ".text\n");
