// A metadata value: what a GGUF key-value pair or a JSON document (config.json, safetensors
// header) holds. One type for both so that model-config parsing reads either the same way.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace markbase {

struct Value;
using ValueArray = std::vector<Value>;
using ValueObject = std::map<std::string, Value>;

struct Value {
  std::variant<std::monostate, bool, int64_t, uint64_t, double, std::string, ValueArray,
               ValueObject>
      v;

  Value() = default;
  template <class T>
  Value(T x) : v(std::move(x)) {}

  bool is_null() const { return v.index() == 0; }
  bool is_bool() const { return std::holds_alternative<bool>(v); }
  bool is_number() const { return v.index() >= 2 && v.index() <= 4; }
  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_array() const { return std::holds_alternative<ValueArray>(v); }
  bool is_object() const { return std::holds_alternative<ValueObject>(v); }

  double as_double() const;       // any number or bool; throws std::invalid_argument otherwise
  int64_t as_int() const;         // integral numbers (or doubles with an integral value)
  bool as_bool() const;
  const std::string& as_string() const;
  const ValueArray& as_array() const;
  const ValueObject& as_object() const;
  // Object lookup: nullptr when absent or when this is not an object.
  const Value* find(const std::string& key) const;
};

}  // namespace markbase
