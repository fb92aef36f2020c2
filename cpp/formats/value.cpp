#include "formats/value.h"

#include <cmath>
#include <stdexcept>

namespace markbase {

double Value::as_double() const {
  if (auto p = std::get_if<double>(&v)) return *p;
  if (auto p = std::get_if<int64_t>(&v)) return static_cast<double>(*p);
  if (auto p = std::get_if<uint64_t>(&v)) return static_cast<double>(*p);
  if (auto p = std::get_if<bool>(&v)) return *p ? 1.0 : 0.0;
  throw std::invalid_argument("expected a number");
}

int64_t Value::as_int() const {
  if (auto p = std::get_if<int64_t>(&v)) return *p;
  if (auto p = std::get_if<uint64_t>(&v)) {
    if (*p > static_cast<uint64_t>(INT64_MAX)) throw std::invalid_argument("integer too large");
    return static_cast<int64_t>(*p);
  }
  if (auto p = std::get_if<bool>(&v)) return *p ? 1 : 0;
  if (auto p = std::get_if<double>(&v)) {
    if (std::isfinite(*p) && std::floor(*p) == *p && std::fabs(*p) < 9e18)
      return static_cast<int64_t>(*p);
  }
  throw std::invalid_argument("expected an integer");
}

bool Value::as_bool() const {
  if (auto p = std::get_if<bool>(&v)) return *p;
  if (is_number()) return as_double() != 0.0;
  throw std::invalid_argument("expected a boolean");
}

const std::string& Value::as_string() const {
  if (auto p = std::get_if<std::string>(&v)) return *p;
  throw std::invalid_argument("expected a string");
}

const ValueArray& Value::as_array() const {
  if (auto p = std::get_if<ValueArray>(&v)) return *p;
  throw std::invalid_argument("expected an array");
}

const ValueObject& Value::as_object() const {
  if (auto p = std::get_if<ValueObject>(&v)) return *p;
  throw std::invalid_argument("expected an object");
}

const Value* Value::find(const std::string& key) const {
  auto p = std::get_if<ValueObject>(&v);
  if (!p) return nullptr;
  auto it = p->find(key);
  return it == p->end() ? nullptr : &it->second;
}

}  // namespace markbase
