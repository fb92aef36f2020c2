// foundation.cpp -- NSObject, NSAutoreleasePool, NSString, NSError, NSArray, NSDictionary,
// NSNumber and NSURL: the Foundation that metal-cpp host code touches.
//
// Ownership follows Foundation: alloc/new/copy results belong to the caller; convenience
// constructors (stringWithCString:encoding:, errorWithDomain:...) return autoreleased objects.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string_view>

#include "foundation.h"
#include "install.h"

namespace fake_objc {

// ------------------------------------------------------------------ helpers
std::string_view string_text(const void* s) {
  if (!s) return {};
  if (is_const_string(s)) {
    struct CF {
      const void* isa;
      int flags;
      const char* str;
      long length;
    };
    const CF* c = (const CF*)s;
    return std::string_view(c->str, (size_t)c->length);
  }
  return ((const FString*)s)->s;
}

FString* new_string(const std::string& s) {
  FString* o = make<FString>("NSString");
  o->s = s;
  return o;
}

Object* temp_string(const std::string& s) { return autorelease(new_string(s)); }

FError::~FError() {
  release(domain);
  release(user_info);
}
FArray::~FArray() {
  for (Object* o : items) release(o);
}
FDictionary::~FDictionary() {
  for (auto& [k, v] : entries) {
    release(k);
    release(v);
  }
}

namespace {
bool is_string_object(const void* o) {
  return is_const_string(o) || (o && dynamic_cast<const FString*>((const Object*)o) != nullptr);
}
bool objects_equal(const void* a, const void* b) {
  if (a == b) return true;
  if (is_string_object(a) && is_string_object(b)) return string_text(a) == string_text(b);
  return false;
}
}  // namespace

Object* FDictionary::find(const void* key) const {
  for (auto& [k, v] : entries)
    if (objects_equal(k, key)) return v;
  return nullptr;
}

FError* new_error(const char* domain, Int code, const std::string& description) {
  FError* e = make<FError>("NSError");
  e->domain = new_string(domain);
  e->code = code;
  e->description = description;
  return e;
}

FArray* new_array(const std::vector<Object*>& items) {
  FArray* a = make<FArray>("NSArray");
  for (Object* o : items) retain(o);
  a->items = items;
  return a;
}

namespace {

template <class T> T* alloc_as(void* cls_obj) {
  T* o = new T();
  o->isa = (Class*)cls_obj;
  return o;
}

// ------------------------------------------------------------------ NSObject
void install_nsobject() {
  const char* C = "NSObject";
  instance_method(C, "retain", +[](Object* o, SEL) { retain(o); return o; });
  instance_method(C, "release", +[](Object* o, SEL) { release(o); });
  instance_method(C, "autorelease", +[](Object* o, SEL) { return autorelease(o); });
  instance_method(C, "retainCount", +[](Object* o, SEL) { return (UInt)(is_const_string(o) ? ~0ul : (UInt)o->refs.load()); });
  instance_method(C, "hash", +[](Object* o, SEL) { return (UInt)(uintptr_t)o; });
  instance_method(C, "isEqual:", +[](Object* o, SEL, Object* other) { return objects_equal(o, other); });
  instance_method(C, "description", +[](Object* o, SEL) {
    char buf[160];
    snprintf(buf, sizeof buf, "<%s: %p>", o->isa->name.c_str(), (void*)o);
    return temp_string(buf);
  });
  instance_method(C, "respondsToSelector:", +[](Object* o, SEL, SEL s) { return find_method(o, s, nullptr) != nullptr; });
  // metal-cpp's sendMessageSafe asks for a signature only after respondsToSelector: said no;
  // the fake has no NSMethodSignature objects to return for selectors it does implement.
  instance_method(C, "methodSignatureForSelector:", +[](Object* o, SEL, SEL s) -> Object* {
    if (find_method(o, s, nullptr)) {
      fprintf(stderr, "[-%s methodSignatureForSelector:] for an implemented selector is not implemented by the fake Metal runtime\n",
              o->isa->name.c_str());
      abort();
    }
    return nullptr;
  });
  // Class objects inherit the instance methods above (their metaclass chain ends at NSObject);
  // class objects are never freed.
  class_method(C, "retain", +[](Object* o, SEL) { return o; });
  class_method(C, "release", +[](Object*, SEL) {});
  class_method(C, "autorelease", +[](Object* o, SEL) { return o; });
}

// ------------------------------------------------------------------ NSAutoreleasePool
void install_pool() {
  const char* C = "NSAutoreleasePool";
  class_method(C, "alloc", +[](void* c, SEL) { return alloc_as<Object>(c); });
  instance_method(C, "init", +[](Object* p, SEL) {
    push_pool(p);
    return p;
  });
  auto drain = +[](Object* p, SEL) {
    drain_pool(p);
    delete p;
  };
  instance_method(C, "drain", drain);
  instance_method(C, "release", drain);  // releasing a pool drains it
  instance_method(C, "retain", +[](Object*, SEL) -> Object* {
    fprintf(stderr, "[-NSAutoreleasePool retain]: pools cannot be retained (Foundation raises here)\n");
    abort();
  });
  // Into the innermost pool of the thread, which is the receiver in the usual pool-per-scope code.
  instance_method(C, "addObject:", +[](Object*, SEL, Object* o) { autorelease(o); });
}

// ------------------------------------------------------------------ NSString
void install_string() {
  const char* C = "NSString";
  class_method(C, "alloc", +[](void* c, SEL) { return alloc_as<FString>(c); });
  class_method(C, "string", +[](void*, SEL) { return temp_string(""); });
  class_method(C, "stringWithString:", +[](void*, SEL, Object* s) { return temp_string(std::string(string_text(s))); });
  class_method(C, "stringWithCString:encoding:", +[](void*, SEL, const char* s, UInt) -> Object* {
    return s ? temp_string(s) : nullptr;
  });
  instance_method(C, "init", +[](FString* o, SEL) { return o; });
  instance_method(C, "initWithString:", +[](FString* o, SEL, Object* s) {
    o->s = std::string(string_text(s));
    return o;
  });
  instance_method(C, "initWithCString:encoding:", +[](FString* o, SEL, const char* s, UInt) {
    o->s = s ? s : "";
    return o;
  });
  instance_method(C, "initWithBytesNoCopy:length:encoding:freeWhenDone:",
                  +[](FString* o, SEL, void* bytes, UInt len, UInt, bool free_when_done) {
                    o->s.assign((const char*)bytes, len);
                    if (free_when_done) free(bytes);
                    return o;
                  });
  // The text of a constant string is NUL-terminated too; a dynamic one is a std::string.
  instance_method(C, "UTF8String", +[](Object* o, SEL) { return string_text(o).data(); });
  instance_method(C, "cStringUsingEncoding:", +[](Object* o, SEL, UInt) { return string_text(o).data(); });
  instance_method(C, "fileSystemRepresentation", +[](Object* o, SEL) { return string_text(o).data(); });
  instance_method(C, "length", +[](Object* o, SEL) { return (UInt)string_text(o).size(); });
  instance_method(C, "lengthOfBytesUsingEncoding:", +[](Object* o, SEL, UInt) { return (UInt)string_text(o).size(); });
  instance_method(C, "maximumLengthOfBytesUsingEncoding:", +[](Object* o, SEL, UInt) { return (UInt)string_text(o).size() * 3; });
  instance_method(C, "characterAtIndex:", +[](Object* o, SEL, UInt i) { return (unsigned short)(unsigned char)string_text(o).at(i); });
  instance_method(C, "isEqualToString:", +[](Object* o, SEL, Object* other) { return other && string_text(o) == string_text(other); });
  instance_method(C, "hash", +[](Object* o, SEL) { return (UInt)std::hash<std::string_view>()(string_text(o)); });
  instance_method(C, "description", +[](Object* o, SEL) { retain(o); return autorelease(o); });
  instance_method(C, "copy", +[](Object* o, SEL) { retain(o); return o; });  // immutable: a copy is the same object
  instance_method(C, "stringByAppendingString:", +[](Object* o, SEL, Object* other) {
    return temp_string(std::string(string_text(o)) + std::string(string_text(other)));
  });
  instance_method(C, "rangeOfString:options:", +[](Object* o, SEL, Object* other, UInt) {
    size_t p = string_text(o).find(string_text(other));
    return p == std::string_view::npos ? NSRange{(UInt)0x7fffffffffffffffL, 0} : NSRange{p, string_text(other).size()};
  });
}

// ------------------------------------------------------------------ NSError
void install_error() {
  const char* C = "NSError";
  auto init = +[](FError* e, SEL, Object* domain, Int code, Object* info) {
    retain(domain);
    retain(info);
    e->domain = domain;
    e->code = code;
    e->user_info = info;
    return e;
  };
  class_method(C, "alloc", +[](void* c, SEL) { return alloc_as<FError>(c); });
  instance_method(C, "initWithDomain:code:userInfo:", init);
  class_method(C, "errorWithDomain:code:userInfo:", +[](void* c, SEL, Object* domain, Int code, Object* info) {
    FError* e = alloc_as<FError>(c);
    retain(domain);
    retain(info);
    e->domain = domain;
    e->code = code;
    e->user_info = info;
    return autorelease(e);
  });
  instance_method(C, "domain", +[](FError* e, SEL) { return e->domain; });
  instance_method(C, "code", +[](FError* e, SEL) { return e->code; });
  instance_method(C, "userInfo", +[](FError* e, SEL) { return e->user_info; });
  instance_method(C, "localizedDescription", +[](FError* e, SEL) -> Object* {
    if (!e->description.empty()) return temp_string(e->description);
    if (auto* d = dynamic_cast<FDictionary*>(e->user_info)) {
      FString key;
      key.s = "NSLocalizedDescription";
      if (Object* v = d->find(&key)) return v;
    }
    return temp_string("The operation couldn't be completed. (" + std::string(string_text(e->domain)) + " error " +
                       std::to_string(e->code) + ".)");
  });
  // Apple returns nil for these when the error doesn't say more.
  instance_method(C, "localizedFailureReason", +[](FError*, SEL) -> Object* { return nullptr; });
  instance_method(C, "localizedRecoverySuggestion", +[](FError*, SEL) -> Object* { return nullptr; });
  instance_method(C, "localizedRecoveryOptions", +[](FError*, SEL) -> Object* { return nullptr; });
}

// ------------------------------------------------------------------ NSArray, NSDictionary
void install_collections() {
  const char* A = "NSArray";
  class_method(A, "alloc", +[](void* c, SEL) { return alloc_as<FArray>(c); });
  class_method(A, "array", +[](void*, SEL) { return autorelease(new_array({})); });
  class_method(A, "arrayWithObject:", +[](void*, SEL, Object* o) { return autorelease(new_array({o})); });
  class_method(A, "arrayWithObjects:count:", +[](void*, SEL, Object* const* objs, UInt n) {
    return autorelease(new_array(std::vector<Object*>(objs, objs + n)));
  });
  instance_method(A, "initWithObjects:count:", +[](FArray* a, SEL, Object* const* objs, UInt n) {
    for (UInt i = 0; i < n; ++i) {
      retain(objs[i]);
      a->items.push_back(objs[i]);
    }
    return a;
  });
  instance_method(A, "count", +[](FArray* a, SEL) { return (UInt)a->items.size(); });
  instance_method(A, "objectAtIndex:", +[](FArray* a, SEL, UInt i) -> Object* {
    if (i >= a->items.size()) {
      fprintf(stderr, "[-NSArray objectAtIndex:]: index %lu beyond bounds [0 .. %zu] (Foundation raises here)\n", i,
              a->items.size());
      abort();
    }
    return a->items[i];
  });

  const char* D = "NSDictionary";
  auto fill = [](FDictionary* d, Object* const* objs, Object* const* keys, UInt n) {
    for (UInt i = 0; i < n; ++i) {
      retain(keys[i]);
      retain(objs[i]);
      d->entries.push_back({keys[i], objs[i]});
    }
  };
  static decltype(fill) s_fill = fill;
  class_method(D, "alloc", +[](void* c, SEL) { return alloc_as<FDictionary>(c); });
  class_method(D, "dictionary", +[](void* c, SEL) { return autorelease(alloc_as<FDictionary>(c)); });
  class_method(D, "dictionaryWithObject:forKey:", +[](void* c, SEL, Object* o, Object* k) {
    FDictionary* d = alloc_as<FDictionary>(c);
    s_fill(d, &o, &k, 1);
    return autorelease(d);
  });
  class_method(D, "dictionaryWithObjects:forKeys:count:", +[](void* c, SEL, Object* const* objs, Object* const* keys, UInt n) {
    FDictionary* d = alloc_as<FDictionary>(c);
    s_fill(d, objs, keys, n);
    return autorelease(d);
  });
  instance_method(D, "initWithObjects:forKeys:count:", +[](FDictionary* d, SEL, Object* const* objs, Object* const* keys, UInt n) {
    s_fill(d, objs, keys, n);
    return d;
  });
  instance_method(D, "count", +[](FDictionary* d, SEL) { return (UInt)d->entries.size(); });
  instance_method(D, "objectForKey:", +[](FDictionary* d, SEL, Object* k) { return d->find(k); });
}

// ------------------------------------------------------------------ NSNumber
template <class T> void number_type(const char* with, const char* init, const char* value) {
  // numberWithX: / initWithX: store the value; every xValue getter converts from it.
  class_method("NSNumber", with, +[](void* c, SEL, T v) {
    FNumber* n = alloc_as<FNumber>(c);
    n->is_float = std::is_floating_point_v<T>;
    n->is_unsigned = std::is_unsigned_v<T>;
    n->d = (double)v;
    n->i = (long long)v;
    n->u = (unsigned long long)v;
    return autorelease(n);
  });
  instance_method("NSNumber", init, +[](FNumber* n, SEL, T v) {
    n->is_float = std::is_floating_point_v<T>;
    n->is_unsigned = std::is_unsigned_v<T>;
    n->d = (double)v;
    n->i = (long long)v;
    n->u = (unsigned long long)v;
    return n;
  });
  instance_method("NSNumber", value, +[](FNumber* n, SEL) {
    if (n->is_float) return (T)n->d;
    return n->is_unsigned ? (T)n->u : (T)n->i;
  });
}
void install_number() {
  class_method("NSNumber", "alloc", +[](void* c, SEL) { return alloc_as<FNumber>(c); });
  number_type<char>("numberWithChar:", "initWithChar:", "charValue");
  number_type<unsigned char>("numberWithUnsignedChar:", "initWithUnsignedChar:", "unsignedCharValue");
  number_type<short>("numberWithShort:", "initWithShort:", "shortValue");
  number_type<unsigned short>("numberWithUnsignedShort:", "initWithUnsignedShort:", "unsignedShortValue");
  number_type<int>("numberWithInt:", "initWithInt:", "intValue");
  number_type<unsigned int>("numberWithUnsignedInt:", "initWithUnsignedInt:", "unsignedIntValue");
  number_type<long>("numberWithLong:", "initWithLong:", "longValue");
  number_type<unsigned long>("numberWithUnsignedLong:", "initWithUnsignedLong:", "unsignedLongValue");
  number_type<long long>("numberWithLongLong:", "initWithLongLong:", "longLongValue");
  number_type<unsigned long long>("numberWithUnsignedLongLong:", "initWithUnsignedLongLong:", "unsignedLongLongValue");
  number_type<float>("numberWithFloat:", "initWithFloat:", "floatValue");
  number_type<double>("numberWithDouble:", "initWithDouble:", "doubleValue");
  number_type<bool>("numberWithBool:", "initWithBool:", "boolValue");
  instance_method("NSNumber", "integerValue", +[](FNumber* n, SEL) { return n->is_float ? (Int)n->d : (Int)n->i; });
  instance_method("NSNumber", "unsignedIntegerValue", +[](FNumber* n, SEL) { return n->is_float ? (UInt)n->d : (UInt)n->u; });
  instance_method("NSNumber", "stringValue", +[](FNumber* n, SEL) {
    char buf[64];
    if (n->is_float) snprintf(buf, sizeof buf, "%.17g", n->d);
    else if (n->is_unsigned) snprintf(buf, sizeof buf, "%llu", n->u);
    else snprintf(buf, sizeof buf, "%lld", n->i);
    return temp_string(buf);
  });
}

// ------------------------------------------------------------------ NSURL
void install_url() {
  const char* C = "NSURL";
  class_method(C, "alloc", +[](void* c, SEL) { return alloc_as<FURL>(c); });
  class_method(C, "fileURLWithPath:", +[](void* c, SEL, Object* path) {
    FURL* u = alloc_as<FURL>(c);
    u->path = std::string(string_text(path));
    return autorelease(u);
  });
  instance_method(C, "initFileURLWithPath:", +[](FURL* u, SEL, Object* path) {
    u->path = std::string(string_text(path));
    return u;
  });
  instance_method(C, "initWithString:", +[](FURL* u, SEL, Object* s) {
    std::string t(string_text(s));
    u->path = t.rfind("file://", 0) == 0 ? t.substr(7) : t;
    return u;
  });
  instance_method(C, "fileSystemRepresentation", +[](FURL* u, SEL) { return u->path.c_str(); });
}

}  // namespace

void install_root() {
  install_nsobject();
  install_pool();
}

void install_foundation() {
  install_string();
  install_error();
  install_collections();
  install_number();
  install_url();
}

}  // namespace fake_objc
