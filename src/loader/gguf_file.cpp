#include "loader/gguf_file.h"

#include <algorithm>
#include <limits>
#include <set>

#include "loader/mapped_file.h"
#include "loader/utf8_check.h"

namespace osprey {

namespace {

constexpr uint32_t kMaxDimsGguf = 4;
// Smallest encodings, used to bound counts by the bytes that remain:
// a key/value is a u64 key length + u32 type + at least one value byte; a
// tensor info is a u64 name length + u32 n_dims + one u64 dim + u32 type + u64 offset.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
constexpr uint64_t kMaxAlignment = uint64_t{1} << 30;

// ggml type ids and names, for error messages about types osprey refuses.
std::string ggml_type_name(uint32_t id) {
  static const char* const kNames[] = {
      "F32",     "F16",    "Q4_0",  "Q4_1",   "Q4_2", "Q4_3",   "Q5_0",  "Q5_1",  "Q8_0",   "Q8_1",
      "Q2_K",    "Q3_K",   "Q4_K",  "Q5_K",   "Q6_K", "Q8_K",   "IQ2_XXS", "IQ2_XS", "IQ3_XXS",
      "IQ1_S",   "IQ4_NL", "IQ3_S", "IQ2_S",  "IQ4_XS", "I8",   "I16",   "I32",   "I64",    "F64",
      "IQ1_M",   "BF16",   "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4",
      "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4"};
  if (id < sizeof(kNames) / sizeof(kNames[0])) return kNames[id];
  return "unknown";
}

std::optional<DType> dtype_from_ggml(uint32_t id) {
  switch (id) {
    case 0: return DType::kF32;
    case 1: return DType::kF16;
    case 2: return DType::kQ4_0;
    case 3: return DType::kQ4_1;
    case 8: return DType::kQ8_0;
    case 30: return DType::kBF16;
    default: return std::nullopt;
  }
}

bool is_integer_type(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64: return true;
    default: return false;
  }
}

// Bytes of one fixed-size value, 0 for strings and arrays.
size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool: return 1;
    case GgufType::kU16:
    case GgufType::kI16: return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32: return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64: return 8;
    default: return 0;
  }
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kU8: return "u8";
    case GgufType::kI8: return "i8";
    case GgufType::kU16: return "u16";
    case GgufType::kI16: return "i16";
    case GgufType::kU32: return "u32";
    case GgufType::kI32: return "i32";
    case GgufType::kF32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kU64: return "u64";
    case GgufType::kI64: return "i64";
    case GgufType::kF64: return "f64";
  }
  return "?";
}

// Reads the file front to back. Every read checks the remaining bytes first.
class GgufParser {
 public:
  GgufParser(const uint8_t* data, size_t size, GgufFile& out) : p_(data), size_(size), out_(out) {}

  Status run();

 private:
  size_t remaining() const { return size_ - pos_; }
  Status error(const std::string& what) const {
    return corrupt("GGUF '" + out_.name_ + "': " + what + " (at byte " + std::to_string(pos_) + ")");
  }
  Status truncated(const std::string& what) const {
    return corrupt("GGUF '" + out_.name_ + "': file truncated while reading " + what + " (at byte " +
                   std::to_string(pos_) + " of " + std::to_string(size_) + ")");
  }

  template <class T>
  Status read_pod(T& v, const char* what) {
    if (remaining() < sizeof(T)) return truncated(what);
    std::memcpy(&v, p_ + pos_, sizeof(T));  // GGUF is little-endian, as are the hosts osprey targets
    pos_ += sizeof(T);
    return Status::Ok();
  }
  // `what` and `key` form the error message, built only on failure.
  Status read_string(std::string& s, const char* what, std::string_view key = {});
  Status read_scalar(GgufType t, GgufValue& v, const std::string& what);
  Status read_value(GgufType t, GgufValue& v, const std::string& key);
  Status read_array(GgufValue& v, const std::string& key);
  Status read_kv(std::set<std::string, std::less<>>& seen);
  Status read_tensor_info(GgufTensorInfo& ti);
  Status set_alignment();
  Status place_tensors();

  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  GgufFile& out_;
};

Status GgufParser::read_string(std::string& s, const char* what, std::string_view key) {
  auto describe = [&] { return key.empty() ? std::string(what) : std::string(what) + " '" + std::string(key) + "'"; };
  uint64_t len = 0;
  if (remaining() < 8) return truncated(describe());
  std::memcpy(&len, p_ + pos_, 8);
  pos_ += 8;
  if (len > remaining()) {
    return error(describe() + " has length " + std::to_string(len) + " but only " +
                 std::to_string(remaining()) + " bytes remain");
  }
  std::string_view sv(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
  if (!is_valid_utf8(sv)) return error(describe() + " is not valid UTF-8");
  s.assign(sv);
  pos_ += static_cast<size_t>(len);
  return Status::Ok();
}

Status GgufParser::read_scalar(GgufType t, GgufValue& v, const std::string& what) {
  switch (t) {
    case GgufType::kU8: { uint8_t x{}; OSP_RETURN_IF_ERROR(read_pod(x, what.c_str())); v.u = x; v.i = x; v.f = x; break; }
    case GgufType::kI8: { int8_t x{}; OSP_RETURN_IF_ERROR(read_pod(x, what.c_str())); v.i = x; v.u = static_cast<uint64_t>(v.i); v.f = x; break; }
    case GgufType::kU16: { uint16_t x{}; OSP_RETURN_IF_ERROR(read_pod(x, what.c_str())); v.u = x; v.i = x; v.f = x; break; }
    case GgufType::kI16: { int16_t x{}; OSP_RETURN_IF_ERROR(read_pod(x, what.c_str())); v.i = x; v.u = static_cast<uint64_t>(v.i); v.f = x; break; }
    case GgufType::kU32: { uint32_t x{}; OSP_RETURN_IF_ERROR(read_pod(x, what.c_str())); v.u = x; v.i = x; v.f = x; break; }
    case GgufType::kI32: { int32_t x{}; OSP_RETURN_IF_ERROR(read_pod(x, what.c_str())); v.i = x; v.u = static_cast<uint64_t>(v.i); v.f = x; break; }
    case GgufType::kU64: { uint64_t x{}; OSP_RETURN_IF_ERROR(read_pod(x, what.c_str())); v.u = x; v.i = static_cast<int64_t>(x); v.f = static_cast<double>(x); break; }
    case GgufType::kI64: { int64_t x{}; OSP_RETURN_IF_ERROR(read_pod(x, what.c_str())); v.i = x; v.u = static_cast<uint64_t>(x); v.f = static_cast<double>(x); break; }
    case GgufType::kF32: { float x{}; OSP_RETURN_IF_ERROR(read_pod(x, what.c_str())); v.f = x; break; }
    case GgufType::kF64: { double x{}; OSP_RETURN_IF_ERROR(read_pod(x, what.c_str())); v.f = x; break; }
    case GgufType::kBool: {
      uint8_t x = 0;
      OSP_RETURN_IF_ERROR(read_pod(x, what.c_str()));
      if (x > 1) return error(what + " is a bool with value " + std::to_string(x));
      v.b = x != 0;
      v.u = x;
      v.i = x;
      v.f = x;
      break;
    }
    case GgufType::kString: OSP_RETURN_IF_ERROR(read_string(v.s, what.c_str())); break;
    default: return error(what + " has non-scalar type " + std::string(gguf_type_name(t)));
  }
  return Status::Ok();
}

Status GgufParser::read_array(GgufValue& v, const std::string& key) {
  uint32_t et = 0;
  OSP_RETURN_IF_ERROR(read_pod(et, ("array type of '" + key + "'").c_str()));
  if (et > static_cast<uint32_t>(GgufType::kF64)) {
    return error("array '" + key + "' has unknown element type " + std::to_string(et));
  }
  const auto elem = static_cast<GgufType>(et);
  if (elem == GgufType::kArray) {
    return error("array '" + key + "' contains arrays; nested arrays are not supported");
  }
  uint64_t count = 0;
  OSP_RETURN_IF_ERROR(read_pod(count, ("array length of '" + key + "'").c_str()));
  // Each element takes at least this many bytes of the file.
  const uint64_t min_elem = elem == GgufType::kString ? 8 : scalar_size(elem);
  if (count > remaining() / min_elem) {
    return error("array '" + key + "' claims " + std::to_string(count) + " elements of type " +
                 std::string(gguf_type_name(elem)) + " but only " + std::to_string(remaining()) +
                 " bytes remain");
  }
  v.array_type = elem;
  const size_t n = static_cast<size_t>(count);
  if (elem == GgufType::kString) {
    v.strs.resize(n);
    for (size_t k = 0; k < n; ++k) {
      OSP_RETURN_IF_ERROR(read_string(v.strs[k], "a string element of array", key));
    }
  } else if (elem == GgufType::kF32 || elem == GgufType::kF64) {
    v.floats.resize(n);
    for (size_t k = 0; k < n; ++k) {
      if (elem == GgufType::kF32) {
        float x = 0;
        std::memcpy(&x, p_ + pos_, 4);
        v.floats[k] = x;
      } else {
        std::memcpy(&v.floats[k], p_ + pos_, 8);
      }
      pos_ += min_elem;  // in bounds: count * min_elem <= remaining() was checked above
    }
  } else {
    // Integers and bools; in bounds: count * min_elem <= remaining() was checked above.
    v.ints.resize(n);
    for (size_t k = 0; k < n; ++k) {
      const uint8_t* q = p_ + pos_;
      int64_t x = 0;
      switch (elem) {
        case GgufType::kU8: x = q[0]; break;
        case GgufType::kBool:
          if (q[0] > 1) return error("array '" + key + "' holds a bool with value " + std::to_string(q[0]));
          x = q[0];
          break;
        case GgufType::kI8: x = static_cast<int8_t>(q[0]); break;
        case GgufType::kU16: { uint16_t y; std::memcpy(&y, q, 2); x = y; break; }
        case GgufType::kI16: { int16_t y; std::memcpy(&y, q, 2); x = y; break; }
        case GgufType::kU32: { uint32_t y; std::memcpy(&y, q, 4); x = y; break; }
        case GgufType::kI32: { int32_t y; std::memcpy(&y, q, 4); x = y; break; }
        case GgufType::kU64:
        case GgufType::kI64: std::memcpy(&x, q, 8); break;
        default: return error("array '" + key + "' has unexpected element type");
      }
      v.ints[k] = x;
      pos_ += min_elem;
    }
  }
  return Status::Ok();
}

Status GgufParser::read_value(GgufType t, GgufValue& v, const std::string& key) {
  v.type = t;
  if (t == GgufType::kArray) return read_array(v, key);
  return read_scalar(t, v, "value of '" + key + "'");
}

Status GgufParser::read_kv(std::set<std::string, std::less<>>& seen) {
  std::string key;
  OSP_RETURN_IF_ERROR(read_string(key, "a metadata key"));
  if (key.empty()) return error("empty metadata key");
  if (seen.count(key) != 0) return error("duplicate metadata key '" + key + "'");
  uint32_t type = 0;
  OSP_RETURN_IF_ERROR(read_pod(type, ("type of '" + key + "'").c_str()));
  if (type > static_cast<uint32_t>(GgufType::kF64)) {
    return error("metadata key '" + key + "' has unknown value type " + std::to_string(type));
  }
  GgufValue v;
  OSP_RETURN_IF_ERROR(read_value(static_cast<GgufType>(type), v, key));
  seen.insert(key);
  out_.metadata_.emplace_back(std::move(key), std::move(v));
  return Status::Ok();
}

Status GgufParser::read_tensor_info(GgufTensorInfo& ti) {
  OSP_RETURN_IF_ERROR(read_string(ti.name, "a tensor name"));
  if (ti.name.empty()) return error("empty tensor name");
  const std::string q = "tensor '" + ti.name + "'";
  uint32_t n_dims = 0;
  OSP_RETURN_IF_ERROR(read_pod(n_dims, ("dimension count of " + q).c_str()));
  if (n_dims == 0 || n_dims > kMaxDimsGguf) {
    return error(q + " has " + std::to_string(n_dims) + " dimensions (must be 1 to 4)");
  }
  uint64_t ne[kMaxDimsGguf] = {};
  int64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    OSP_RETURN_IF_ERROR(read_pod(ne[d], ("dimensions of " + q).c_str()));
    if (ne[d] == 0) return error(q + " has a zero-length dimension " + std::to_string(d));
    if (ne[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, static_cast<int64_t>(ne[d]), &numel)) {
      return error(q + " has a shape whose element count overflows 64 bits");
    }
  }
  uint32_t type = 0;
  OSP_RETURN_IF_ERROR(read_pod(type, ("type of " + q).c_str()));
  OSP_RETURN_IF_ERROR(read_pod(ti.offset, ("data offset of " + q).c_str()));
  const std::optional<DType> dt = dtype_from_ggml(type);
  if (!dt) {
    return unsupported("GGUF '" + out_.name_ + "': " + q + " has type " + ggml_type_name(type) + " (" +
                       std::to_string(type) + "), which osprey does not support");
  }
  ti.dtype = *dt;
  const int64_t block = dtype_block_elems(ti.dtype);
  if (static_cast<int64_t>(ne[0]) % block != 0) {
    return error(q + " of type " + std::string(dtype_name(ti.dtype)) + " has rows of " +
                 std::to_string(ne[0]) + " elements, not a multiple of the block size " +
                 std::to_string(block));
  }
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(numel / block, dtype_block_bytes(ti.dtype), &nbytes)) {
    return error(q + " has a byte size that overflows 64 bits");
  }
  ti.nbytes = static_cast<uint64_t>(nbytes);
  ti.shape.resize(n_dims);
  for (uint32_t d = 0; d < n_dims; ++d) ti.shape[n_dims - 1 - d] = static_cast<int64_t>(ne[d]);
  return Status::Ok();
}

Status GgufParser::set_alignment() {
  const GgufValue* v = out_.find("general.alignment");
  if (v == nullptr) return Status::Ok();
  if (!is_integer_type(v->type)) {
    return error("general.alignment has type " + std::string(gguf_type_name(v->type)) + ", not an integer");
  }
  const uint64_t a = v->u;
  if (a == 0 || (a & (a - 1)) != 0 || a > kMaxAlignment) {
    return error("general.alignment is " + std::to_string(v->i) + ", not a power of two up to 2^30");
  }
  out_.alignment_ = static_cast<size_t>(a);
  return Status::Ok();
}

Status GgufParser::place_tensors() {
  const size_t a = out_.alignment_;
  // pos_ <= size_ and a <= 2^30, so this cannot overflow size_t on 64-bit hosts.
  const size_t data_start = (pos_ + a - 1) / a * a;
  if (data_start > size_) {
    if (!out_.tensors_.empty()) {
      return error("data section starts at byte " + std::to_string(data_start) + ", past the end of the file");
    }
    out_.data_section_ = p_ + size_;
    out_.data_section_size_ = 0;
    return Status::Ok();
  }
  out_.data_section_ = p_ + data_start;
  out_.data_section_size_ = size_ - data_start;
  const uint64_t avail = out_.data_section_size_;

  std::vector<size_t> order(out_.tensors_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  for (const GgufTensorInfo& ti : out_.tensors_) {
    if (ti.offset % a != 0) {
      return error("tensor '" + ti.name + "' has data offset " + std::to_string(ti.offset) +
                   ", not a multiple of the alignment " + std::to_string(a));
    }
    if (ti.offset > avail || ti.nbytes > avail - ti.offset) {
      return error("tensor '" + ti.name + "' data [" + std::to_string(ti.offset) + ", +" +
                   std::to_string(ti.nbytes) + ") lies past the end of the data section (" +
                   std::to_string(avail) + " bytes)");
    }
  }
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return out_.tensors_[x].offset < out_.tensors_[y].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& prev = out_.tensors_[order[k - 1]];
    const GgufTensorInfo& cur = out_.tensors_[order[k]];
    if (prev.offset + prev.nbytes > cur.offset) {
      return error("tensors '" + prev.name + "' and '" + cur.name + "' overlap in the data section");
    }
  }
  for (GgufTensorInfo& ti : out_.tensors_) ti.data = out_.data_section_ + ti.offset;
  return Status::Ok();
}

Status GgufParser::run() {
  if (size_ < 4) return truncated("the magic number");
  if (std::memcmp(p_, "GGUF", 4) != 0) return error("not a GGUF file (bad magic)");
  pos_ = 4;
  OSP_RETURN_IF_ERROR(read_pod(out_.version_, "the version"));
  if (out_.version_ != 2 && out_.version_ != 3) {
    std::string hint;
    if (out_.version_ == 1) hint = " (GGUF v1 is obsolete; reconvert the model)";
    if ((out_.version_ & 0xffff) == 0 && out_.version_ != 0) hint = " (big-endian GGUF is not supported)";
    return unsupported("GGUF '" + out_.name_ + "': version " + std::to_string(out_.version_) +
                       " is not supported (need 2 or 3)" + hint);
  }
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
  OSP_RETURN_IF_ERROR(read_pod(n_tensors, "the tensor count"));
  OSP_RETURN_IF_ERROR(read_pod(n_kv, "the metadata count"));
  if (n_kv > remaining() / kMinKvBytes) {
    return error("metadata count " + std::to_string(n_kv) + " is impossible for the " +
                 std::to_string(remaining()) + " bytes that remain");
  }
  if (n_tensors > remaining() / kMinTensorInfoBytes) {
    return error("tensor count " + std::to_string(n_tensors) + " is impossible for the " +
                 std::to_string(remaining()) + " bytes that remain");
  }
  out_.metadata_.reserve(static_cast<size_t>(n_kv));
  std::set<std::string, std::less<>> seen;
  for (uint64_t k = 0; k < n_kv; ++k) OSP_RETURN_IF_ERROR(read_kv(seen));
  for (size_t k = 0; k < out_.metadata_.size(); ++k) out_.key_index_.emplace(out_.metadata_[k].first, k);
  OSP_RETURN_IF_ERROR(set_alignment());

  if (n_tensors > remaining() / kMinTensorInfoBytes) {
    return error("tensor count " + std::to_string(n_tensors) + " is impossible for the " +
                 std::to_string(remaining()) + " bytes that remain");
  }
  out_.tensors_.resize(static_cast<size_t>(n_tensors));
  for (size_t k = 0; k < out_.tensors_.size(); ++k) {
    OSP_RETURN_IF_ERROR(read_tensor_info(out_.tensors_[k]));
    if (!out_.tensor_index_.emplace(out_.tensors_[k].name, k).second) {
      return error("duplicate tensor name '" + out_.tensors_[k].name + "'");
    }
  }
  return place_tensors();
}

GgufFile::~GgufFile() = default;

Expected<std::unique_ptr<GgufFile>> GgufFile::parse(const uint8_t* data, size_t size, std::string name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->name_ = std::move(name);
  static const uint8_t kEmpty = 0;
  GgufParser parser(data != nullptr ? data : &kEmpty, data != nullptr ? size : 0, *f);
  OSP_RETURN_IF_ERROR(parser.run());
  return f;
}

Expected<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapping, MappedFile::open(path));
  OSP_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, parse(mapping->data(), mapping->size(), path));
  f->mapping_ = std::move(mapping);
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr || v->type != GgufType::kString) return std::nullopt;
  return v->s;
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type == GgufType::kBool) return v->b ? 1 : 0;
  if (!is_integer_type(v->type)) return std::nullopt;
  if (v->type == GgufType::kU64 && v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return std::nullopt;
  }
  return v->i;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type == GgufType::kF32 || v->type == GgufType::kF64 || is_integer_type(v->type)) return v->f;
  return std::nullopt;
}

const std::vector<std::string>* GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr || v->type != GgufType::kArray || v->array_type != GgufType::kString) return nullptr;
  return &v->strs;
}

std::optional<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr || v->type != GgufType::kArray) return std::nullopt;
  if (!is_integer_type(v->array_type) && v->array_type != GgufType::kBool) return std::nullopt;
  return v->ints;
}

std::optional<std::vector<double>> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr || v->type != GgufType::kArray) return std::nullopt;
  if (v->array_type == GgufType::kF32 || v->array_type == GgufType::kF64) return v->floats;
  if (is_integer_type(v->array_type) || v->array_type == GgufType::kBool) {
    return std::vector<double>(v->ints.begin(), v->ints.end());
  }
  return std::nullopt;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace osprey
