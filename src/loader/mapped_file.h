// MappedFile: RAII read-only memory mapping of a whole file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "osprey/status.h"

namespace osprey {

class MappedFile {
 public:
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Maps `path` read-only (PROT_READ, MAP_PRIVATE). An empty file gives a
  // mapping with size() == 0 and a non-null data() that must not be read.
  static Expected<std::unique_ptr<MappedFile>> open(const std::string& path);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;  // null for empty files
  std::string path_;
};

}  // namespace osprey
