// GgufFile: a parsed GGUF v2/v3 file (metadata and tensor directory).
//
// The parser treats the file as hostile: every count and length is checked
// against the bytes that remain before anything is allocated, and any
// malformation becomes an Expected error naming the file and the problem.
// Tensor data is not copied: GgufTensorInfo::data points into the mapping
// (open) or into the caller's buffer (parse).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "osprey/status.h"

namespace osprey {

class MappedFile;

enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

std::string_view gguf_type_name(GgufType t);

// One metadata value. Scalars: integer types fill u (as unsigned bits), i
// (signed value; u64 above INT64_MAX leaves i wrapped) and f; bool fills b, u,
// i; floats fill f; strings fill s. Arrays (type == kArray) hold elements of
// array_type in exactly one of: strs (strings), ints (integers and bools;
// u64 elements above INT64_MAX are stored wrapped), floats (f32/f64).
// Arrays of arrays are refused by the parser.
struct GgufValue {
  GgufType type = GgufType::kU8;
  GgufType array_type = GgufType::kU8;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<std::string> strs;
  std::vector<int64_t> ints;
  std::vector<double> floats;
};

struct GgufTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  // Row-major, outermost first: GGUF's ne order reversed, so a ggml
  // [576 x 49152] embedding (ne = {576, 49152}) has shape {49152, 576}.
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // bytes from the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // data section + offset; nbytes readable
};

class GgufFile {
 public:
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  // Maps the file and parses it; the GgufFile owns the mapping.
  static Expected<std::unique_ptr<GgufFile>> open(const std::string& path);
  // Parses data[0, size) without owning it; data must outlive the result.
  // `name` is used in error messages.
  static Expected<std::unique_ptr<GgufFile>> parse(const uint8_t* data, size_t size, std::string name);

  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  const std::string& name() const { return name_; }

  const GgufValue* find(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  // Any integer type or bool; nullopt for u64 values above INT64_MAX.
  std::optional<int64_t> get_int(std::string_view key) const;
  // f32/f64 or any integer type.
  std::optional<double> get_float(std::string_view key) const;
  const std::vector<std::string>* get_string_array(std::string_view key) const;
  std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const;
  // Float arrays, or integer arrays converted to double.
  std::optional<std::vector<double>> get_float_array(std::string_view key) const;

  // In file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  // Start and size of the data section (tensor offsets are relative to it).
  const uint8_t* data_section() const { return data_section_; }
  size_t data_section_size() const { return data_section_size_; }

 private:
  GgufFile() = default;
  friend class GgufParser;

  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::string name_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> key_index_;     // key -> metadata_ index
  std::map<std::string, size_t, std::less<>> tensor_index_;  // name -> tensors_ index
  const uint8_t* data_section_ = nullptr;
  size_t data_section_size_ = 0;
  std::unique_ptr<MappedFile> mapping_;  // null when parsed from a caller's buffer
};

}  // namespace osprey
