// objc.h -- the object model of the fake Objective-C runtime (internal to fake_metal/).
//
// metal-cpp turns every call into objc_msgSend(receiver, selector, args...). Here every
// receiver is a fake_objc::Object (or a compiler-emitted constant string, see is_const_string),
// whose class holds a table selector -> C++ function with the method's exact C signature, so
// the trampoline can jump to it with the caller's argument registers untouched.
#pragma once
#include <atomic>
#include <string>
#include <string_view>
#include <unordered_map>

#include <objc/runtime.h>

namespace fake_objc {

struct Class;

struct Object {
  Class* isa = nullptr;
  std::atomic<long> refs{1};
  virtual ~Object() = default;
};

struct Class : Object {
  std::string name;
  Class* super = nullptr;
  bool is_meta = false;
  std::unordered_map<SEL, IMP> methods;  // filled while installing, read-only afterwards
};

// Interned selector for a name (the same pointer sel_registerName returns).
SEL sel(const char* name);
// The class `name` (created empty on first mention, like a class the SDK has but the fake
// doesn't implement); ensures the fake classes are installed.
Class* cls(const char* name);
// Declares `name` as a subclass of `super_name` (both created on demand).
Class* define_class(const char* name, const char* super_name);

// Registers an instance (`-`) or class (`+`) method. F is a plain function pointer whose first
// two parameters are the receiver and SEL, then the method's arguments.
void add_method(Class* c, bool class_method, const char* selector, IMP imp);
template <class F> void instance_method(const char* cls_name, const char* selector, F f) {
  add_method(cls(cls_name), false, selector, reinterpret_cast<IMP>(f));
}
template <class F> void class_method(const char* cls_name, const char* selector, F f) {
  add_method(cls(cls_name), true, selector, reinterpret_cast<IMP>(f));
}

// Allocates a T (an Object subclass) of class `cls_name` with one reference.
template <class T> T* make(const char* cls_name) {
  T* o = new T();
  o->isa = cls(cls_name);
  return o;
}

// Reference counting and autorelease pools with Foundation's rules.
void retain(Object* o);
void release(Object* o);
Object* autorelease(Object* o);  // into the innermost pool of this thread (leaks if none, as on macOS)
void push_pool(Object* pool);
void drain_pool(Object* pool);

// A constant string made by the compiler (MTLSTR / CFSTR): its first word is
// &__CFConstantStringClassReference, followed by flags, the bytes and the length.
bool is_const_string(const void* p);
// The text of an NSString receiver, constant or not.
std::string_view string_text(const void* s);

// The implementation of `selector` for `receiver`, or nullptr. `describe` receives the
// "[-Class sel]" spelling used in diagnostics.
IMP find_method(const void* receiver, SEL selector, std::string* describe);
// The same for instances of `c` (or, if c is a metaclass, for class methods of its class).
IMP find_in_class(Class* c, SEL selector, std::string* describe);

}  // namespace fake_objc
