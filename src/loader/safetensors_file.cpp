#include "loader/safetensors_file.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "core/json_nesting.h"
#include "loader/mapped_file.h"

namespace osprey {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // as the reference implementation
constexpr int kMaxJsonDepth = 16;                 // a valid header nests 3 deep
constexpr size_t kMaxDimsSt = 4;

// Element dtypes osprey loads; others are refused by name.
std::optional<DType> dtype_from_safetensors(std::string_view s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  if (s == "F8_E4M3") return DType::kF8E4M3;  // FP8 checkpoints (one byte an element; scales are tensors of their own)
  if (s == "I32") return DType::kI32;
  if (s == "I64") return DType::kI64;
  if (s == "U8") return DType::kU8;
  return std::nullopt;
}

// Nesting depth of the JSON text, counting brackets outside strings; a cheap
// guard before handing hostile text to the JSON parser.
int json_max_depth(std::string_view text) {
  JsonNesting nesting;
  int max_depth = 0;
  for (char c : text)
    if (nesting.feed(c) > 0) max_depth = std::max(max_depth, nesting.depth());
  return max_depth;
}

}  // namespace

SafetensorsFile::~SafetensorsFile() = default;

Status SafetensorsFile::parse_header(const uint8_t* data, size_t size) {
  auto error = [&](const std::string& what) { return corrupt("safetensors '" + name_ + "': " + what); };
  if (size < 8) return error("file of " + std::to_string(size) + " bytes is too short for the header length");
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);
  if (header_len > size - 8) {
    return error("header length " + std::to_string(header_len) + " exceeds the file size " + std::to_string(size));
  }
  if (header_len > kMaxHeaderBytes) {
    return error("header length " + std::to_string(header_len) + " exceeds the limit of 100 MiB");
  }
  if (header_len < 2 || data[8] != '{') return error("header is not a JSON object");
  const std::string_view text(reinterpret_cast<const char*>(data + 8), static_cast<size_t>(header_len));
  if (json_max_depth(text) > kMaxJsonDepth) return error("header JSON nests too deeply");

  // Parse with a callback that records duplicate top-level keys (the JSON
  // library would silently keep the last one).
  std::set<std::string> top_keys;
  std::string duplicate;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(
        text.begin(), text.end(),
        [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string()) {
            if (!top_keys.insert(parsed.get<std::string>()).second && duplicate.empty()) {
              duplicate = parsed.get<std::string>();
            }
          }
          return true;
        });
  } catch (const nlohmann::json::exception& e) {
    return error(std::string("header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) return error("duplicate tensor name '" + duplicate + "' in the header");
  if (!header.is_object()) return error("header is not a JSON object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;
  try {
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& key = it.key();
      const nlohmann::json& v = it.value();
      if (key == "__metadata__") {
        if (!v.is_object()) return error("__metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string()) return error("__metadata__ value of '" + m.key() + "' is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const std::string q = "tensor '" + key + "'";
      if (key.empty()) return error("empty tensor name");
      if (!v.is_object()) return error(q + " is not described by an object");
      auto dt_it = v.find("dtype");
      auto shape_it = v.find("shape");
      auto off_it = v.find("data_offsets");
      if (dt_it == v.end() || !dt_it->is_string()) return error(q + " has no string 'dtype'");
      if (shape_it == v.end() || !shape_it->is_array()) return error(q + " has no array 'shape'");
      if (off_it == v.end() || !off_it->is_array() || off_it->size() != 2) {
        return error(q + " has no 'data_offsets' pair");
      }
      SafetensorsTensorInfo ti;
      ti.name = key;
      const std::string dt_name = dt_it->get<std::string>();
      const std::optional<DType> dt = dtype_from_safetensors(dt_name);
      if (!dt) {
        return unsupported("safetensors '" + name_ + "': " + q + " has dtype " + dt_name +
                           ", which osprey does not support");
      }
      ti.dtype = *dt;
      if (shape_it->size() > kMaxDimsSt) {
        return error(q + " has " + std::to_string(shape_it->size()) + " dimensions (at most 4)");
      }
      int64_t numel = 1;
      for (const nlohmann::json& d : *shape_it) {
        if (!d.is_number_unsigned()) return error(q + " has a shape entry that is not a non-negative integer");
        const uint64_t du = d.get<uint64_t>();
        if (du > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
            __builtin_mul_overflow(numel, static_cast<int64_t>(du), &numel)) {
          return error(q + " has a shape whose element count overflows 64 bits");
        }
        ti.shape.push_back(static_cast<int64_t>(du));
      }
      const nlohmann::json& b = (*off_it)[0];
      const nlohmann::json& e = (*off_it)[1];
      if (!b.is_number_unsigned() || !e.is_number_unsigned()) {
        return error(q + " has data_offsets that are not non-negative integers");
      }
      const uint64_t begin = b.get<uint64_t>();
      const uint64_t end = e.get<uint64_t>();
      if (begin > end) return error(q + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + ") reversed");
      if (end > data_size) {
        return error(q + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     ") past the end of the data section (" + std::to_string(data_size) + " bytes)");
      }
      int64_t nbytes = 0;
      if (__builtin_mul_overflow(numel, dtype_block_bytes(ti.dtype), &nbytes) ||
          static_cast<uint64_t>(nbytes) != end - begin) {
        return error(q + " of dtype " + dt_name + " and " + std::to_string(numel) + " elements should take " +
                     std::to_string(nbytes) + " bytes but data_offsets span " + std::to_string(end - begin));
      }
      ti.offset = begin;
      ti.nbytes = end - begin;
      ti.data = data + data_start + begin;
      tensors_.push_back(std::move(ti));
    }
  } catch (const nlohmann::json::exception& e) {
    return error(std::string("bad header: ") + e.what());
  }

  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsTensorInfo& x, const SafetensorsTensorInfo& y) {
              return x.offset != y.offset ? x.offset < y.offset : x.nbytes < y.nbytes;
            });
  for (size_t k = 1; k < tensors_.size(); ++k) {
    const SafetensorsTensorInfo& prev = tensors_[k - 1];
    const SafetensorsTensorInfo& cur = tensors_[k];
    // Empty tensors occupy no bytes and cannot overlap anything.
    if (prev.nbytes != 0 && cur.nbytes != 0 && prev.offset + prev.nbytes > cur.offset) {
      return error("tensors '" + prev.name + "' and '" + cur.name + "' overlap in the data section");
    }
  }
  for (size_t k = 0; k < tensors_.size(); ++k) tensor_index_.emplace(tensors_[k].name, k);
  return Status::Ok();
}

Expected<std::unique_ptr<SafetensorsFile>> SafetensorsFile::parse(const uint8_t* data, size_t size,
                                                                  std::string name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = std::move(name);
  static const uint8_t kEmpty = 0;
  OSP_RETURN_IF_ERROR(f->parse_header(data != nullptr ? data : &kEmpty, data != nullptr ? size : 0));
  return f;
}

Expected<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapping, MappedFile::open(path));
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, parse(mapping->data(), mapping->size(), path));
  f->mapping_ = std::move(mapping);
  return f;
}

const SafetensorsTensorInfo* SafetensorsFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace osprey
