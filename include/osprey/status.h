// Status and Expected<T>: how expected failures (bad files, bad requests,
// out of memory) travel. Bugs abort through OSP_CHECK instead (src/core/check.h).
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace osprey {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad request or bad option
  kNotFound,          // missing file, key, model
  kCorrupt,           // malformed or hostile file contents
  kUnsupported,       // valid input this build cannot handle (tensor type, component)
  kOutOfRange,        // e.g. prompt longer than the context
  kResourceExhausted, // queue full, KV pages exhausted
  kCancelled,
  kUnavailable,       // engine failed or shutting down
  kInternal,          // a bug surfaced as an error instead of an abort
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE: message", for logs and CLI output.
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or the Status that explains why there is none. A non-ok Status must
// be given when constructing from a Status.
template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Expected(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) std::abort();
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { check(); return std::get<T>(v_); }
  const T& value() const& { check(); return std::get<T>(v_); }
  T&& value() && { check(); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void check() const {
    if (!ok()) std::abort();
  }
  std::variant<T, Status> v_;
};

}  // namespace osprey

// Propagate a non-ok Status from an expression returning Status.
#define OSP_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::osprey::Status osp_status_ = (expr);     \
    if (!osp_status_.ok()) return osp_status_; \
  } while (0)

#define OSP_CONCAT_INNER_(a, b) a##b
#define OSP_CONCAT_(a, b) OSP_CONCAT_INNER_(a, b)
// OSP_ASSIGN_OR_RETURN(auto x, f()); : x = value, or return f's Status.
#define OSP_ASSIGN_OR_RETURN(lhs, expr) \
  OSP_ASSIGN_OR_RETURN_IMPL_(OSP_CONCAT_(osp_exp_, __LINE__), lhs, expr)
#define OSP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
