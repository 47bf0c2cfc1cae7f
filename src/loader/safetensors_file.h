// SafetensorsFile: a parsed .safetensors file (JSON header + raw data).
//
// Layout: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "value"}}, then the data section; offsets are
// relative to the data section. The file is treated as hostile: every
// malformation becomes an Expected error naming the file and the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "osprey/status.h"

namespace osprey {

class MappedFile;

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major, outermost first; 0 to 4 dims
  uint64_t offset = 0;         // bytes from the start of the data section
  uint64_t nbytes = 0;         // == numel * element size
  const uint8_t* data = nullptr;
};

class SafetensorsFile {
 public:
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Maps the file and parses it; the SafetensorsFile owns the mapping.
  static Expected<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Parses data[0, size) without owning it; data must outlive the result.
  static Expected<std::unique_ptr<SafetensorsFile>> parse(const uint8_t* data, size_t size, std::string name);

  const std::string& name() const { return name_; }
  // Sorted by data offset.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const SafetensorsTensorInfo* find_tensor(std::string_view name) const;
  // The "__metadata__" string map (empty if absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  Status parse_header(const uint8_t* data, size_t size);

  std::string name_;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  std::map<std::string, std::string> metadata_;
  std::unique_ptr<MappedFile> mapping_;
};

}  // namespace osprey
