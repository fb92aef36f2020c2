// A read-only memory mapping of a whole file. Tensors of GGUF and safetensors files are views
// into it, so weights are never copied and the OS pages them in on demand.
#pragma once
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

namespace markbase {

class MappedFile {
 public:
  // A missing file throws FileNotFound; an unreadable or empty one throws FormatError.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Raised when a path does not exist (translated to Python's FileNotFoundError).
struct FileNotFound : std::exception {
  explicit FileNotFound(std::string m) : msg(std::move(m)) {}
  const char* what() const noexcept override { return msg.c_str(); }
  std::string msg;
};

}  // namespace markbase
