// foundation.h -- the Foundation objects of the fake runtime, for the Metal classes' use.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "objc.h"

namespace fake_objc {

using UInt = unsigned long;  // NS::UInteger
using Int = long;            // NS::Integer
struct NSRange {
  UInt location, length;
};

struct FString : Object {
  std::string s;
};
struct FError : Object {
  Object* domain = nullptr;  // an NSString
  Int code = 0;
  Object* user_info = nullptr;  // an NSDictionary or nil
  std::string description;
  ~FError() override;
};
struct FArray : Object {
  std::vector<Object*> items;  // retained
  ~FArray() override;
};
struct FDictionary : Object {
  std::vector<std::pair<Object*, Object*>> entries;  // (key, value), both retained
  ~FDictionary() override;
  Object* find(const void* key) const;
};
struct FNumber : Object {
  bool is_float = false;
  bool is_unsigned = false;
  double d = 0;
  long long i = 0;
  unsigned long long u = 0;
};
struct FURL : Object {
  std::string path;
};

// New NSString with one reference (the caller owns it).
FString* new_string(const std::string& s);
// New autoreleased NSString (the convenience-constructor rule).
Object* temp_string(const std::string& s);
// New NSError (one reference) in `domain` with `code` and a localizedDescription.
FError* new_error(const char* domain, Int code, const std::string& description);
// New NSArray (one reference) of the given objects, which it retains.
FArray* new_array(const std::vector<Object*>& items);

}  // namespace fake_objc
