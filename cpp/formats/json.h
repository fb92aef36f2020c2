// A strict JSON parser for config.json, tokenizer_config.json and safetensors headers.
// Bounded: nesting depth is limited and every read is checked against the input's end, so a
// corrupt header raises an error instead of reading past its buffer.
#pragma once
#include <string>
#include <string_view>

#include "formats/value.h"

namespace markbase {

// Throws FormatError("<what>: <problem> at byte N") on malformed input.
Value parse_json(std::string_view text, const std::string& what);

// Reads and parses a whole file; FileNotFound if it does not exist.
Value read_json_file(const std::string& path);

}  // namespace markbase
