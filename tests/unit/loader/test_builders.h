// Byte-level builders for hand-made GGUF and safetensors files in tests.
// They write exactly what the tests ask for, including malformed fields.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace osprey::testing {

class ByteWriter {
 public:
  template <class T>
  void pod(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    raw(s);
  }
  void raw(const std::string& s) { bytes_.insert(bytes_.end(), s.begin(), s.end()); }
  void raw(const std::vector<uint8_t>& b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
  void pad_to(size_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// GGUF value type ids.
enum : uint32_t { kGU8 = 0, kGI8, kGU16, kGI16, kGU32, kGI32, kGF32, kGBool, kGString, kGArray, kGU64, kGI64, kGF64 };
// ggml tensor type ids.
enum : uint32_t { kTF32 = 0, kTF16 = 1, kTQ4_0 = 2, kTQ4_1 = 3, kTQ8_0 = 8, kTQ6_K = 14, kTBF16 = 30 };

class GgufBuilder {
 public:
  struct TensorSpec {
    std::string name;
    std::vector<uint64_t> ne;  // ggml order: innermost first
    uint32_t type;
    std::vector<uint8_t> data;
    int64_t offset_override = -1;  // use instead of the packed offset
  };

  uint32_t version = 3;
  uint32_t alignment = 32;  // used for packing; add general.alignment yourself to change the file's
  int64_t tensor_count_override = -1;
  int64_t kv_count_override = -1;

  // Each kv_* appends one key/value; raw_kv appends pre-encoded bytes (counted as one kv).
  template <class T>
  void kv(const std::string& key, uint32_t type, T v) {
    ByteWriter w;
    w.str(key);
    w.pod<uint32_t>(type);
    w.pod<T>(v);
    add_raw_kv(w.bytes());
  }
  void kv_string(const std::string& key, const std::string& v) {
    ByteWriter w;
    w.str(key);
    w.pod<uint32_t>(kGString);
    w.str(v);
    add_raw_kv(w.bytes());
  }
  void kv_string_array(const std::string& key, const std::vector<std::string>& v) {
    ByteWriter w;
    w.str(key);
    w.pod<uint32_t>(kGArray);
    w.pod<uint32_t>(kGString);
    w.pod<uint64_t>(v.size());
    for (const auto& s : v) w.str(s);
    add_raw_kv(w.bytes());
  }
  template <class T>
  void kv_array(const std::string& key, uint32_t elem_type, const std::vector<T>& v) {
    ByteWriter w;
    w.str(key);
    w.pod<uint32_t>(kGArray);
    w.pod<uint32_t>(elem_type);
    w.pod<uint64_t>(v.size());
    for (const T& x : v) w.pod<T>(x);
    add_raw_kv(w.bytes());
  }
  void add_raw_kv(const std::vector<uint8_t>& b) {
    kvs_.push_back(b);
  }
  void tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, std::vector<uint8_t> data) {
    tensors_.push_back({name, std::move(ne), type, std::move(data)});
  }
  std::vector<TensorSpec>& tensors() { return tensors_; }

  std::vector<uint8_t> build() const {
    ByteWriter w;
    w.raw(std::string("GGUF"));
    w.pod<uint32_t>(version);
    w.pod<uint64_t>(tensor_count_override >= 0 ? static_cast<uint64_t>(tensor_count_override) : tensors_.size());
    w.pod<uint64_t>(kv_count_override >= 0 ? static_cast<uint64_t>(kv_count_override) : kvs_.size());
    for (const auto& b : kvs_) w.raw(b);
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      w.str(t.name);
      w.pod<uint32_t>(static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) w.pod<uint64_t>(d);
      w.pod<uint32_t>(t.type);
      w.pod<uint64_t>(t.offset_override >= 0 ? static_cast<uint64_t>(t.offset_override) : offset);
      offsets.push_back(offset);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    w.pad_to(alignment);
    const size_t data_start = w.bytes().size();
    for (size_t k = 0; k < tensors_.size(); ++k) {
      w.bytes().resize(data_start + offsets[k], 0);
      w.raw(tensors_[k].data);
    }
    if (!tensors_.empty()) w.pad_to(alignment);
    return w.bytes();
  }

 private:
  std::vector<std::vector<uint8_t>> kvs_;
  std::vector<TensorSpec> tensors_;
};

// A safetensors file from a header JSON text and a data section.
inline std::vector<uint8_t> make_safetensors(const std::string& header, const std::vector<uint8_t>& data,
                                             int64_t header_len_override = -1) {
  ByteWriter w;
  w.pod<uint64_t>(header_len_override >= 0 ? static_cast<uint64_t>(header_len_override) : header.size());
  w.raw(header);
  w.raw(data);
  return w.bytes();
}

template <class T>
std::vector<uint8_t> to_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace osprey::testing
