#include "formats/tensor_types.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace markbase {
namespace {

struct Entry { uint32_t id; TypeTraits tr; };
constexpr Entry kTypes[] = {
    {0, {"F32", 1, 4}},           {1, {"F16", 1, 2}},
    {2, {"Q4_0", 32, 18}},        {3, {"Q4_1", 32, 20}},
    {6, {"Q5_0", 32, 22}},        {7, {"Q5_1", 32, 24}},
    {8, {"Q8_0", 32, 34}},        {12, {"Q4_K", 256, 144}},
    {13, {"Q5_K", 256, 176}},     {14, {"Q6_K", 256, 210}},
    {30, {"BF16", 1, 2}},
};

// GGML ids MarkBase does not read, named so that errors say what the file holds.
constexpr const char* kOtherNames[] = {
    nullptr, nullptr, nullptr, nullptr, "Q4_2", "Q4_3", nullptr, nullptr, nullptr, "Q8_1",
    "Q2_K", "Q3_K", nullptr, nullptr, nullptr, "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
    "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M",
    nullptr, "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8",
    "IQ4_NL_8_8", "MXFP4"};

}  // namespace

const TypeTraits* type_traits(uint32_t id) {
  for (const Entry& e : kTypes)
    if (e.id == id) return &e.tr;
  return nullptr;
}

const TypeTraits& traits(TensorType t) {
  const TypeTraits* tr = type_traits(static_cast<uint32_t>(t));
  if (!tr) throw std::logic_error("traits: not a MarkBase tensor type");
  return *tr;
}

std::string ggml_type_name(uint32_t id) {
  if (const TypeTraits* tr = type_traits(id)) return tr->name;
  if (id < sizeof(kOtherNames) / sizeof(kOtherNames[0]) && kOtherNames[id]) return kOtherNames[id];
  return "type id " + std::to_string(id);
}

TensorType type_from_name(const std::string& name) {
  std::string up(name);
  std::transform(up.begin(), up.end(), up.begin(), [](unsigned char c) { return std::toupper(c); });
  for (const Entry& e : kTypes)
    if (up == e.tr.name) return static_cast<TensorType>(e.id);
  throw std::invalid_argument("unknown tensor type '" + name + "'");
}

}  // namespace markbase
