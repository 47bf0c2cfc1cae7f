// Value: the dynamic value type of the chat-template interpreter. It mirrors
// the Python objects a Jinja2 template sees: undefined, None, bool, int
// (64-bit; overflow is an error), float, str (UTF-8), list/tuple, dict
// (insertion-ordered, string keys), callables (builtins, bound methods,
// macros) and namespace objects (the only mutable value).
//
// Lists and dicts are immutable once built and shared by pointer, so copying
// a Value is cheap; ImmutableSandboxedEnvironment forbids mutating them anyway.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "osprey/status.h"

namespace osprey::jinja {

// Thrown inside the interpreter; ChatTemplate turns it into a Status.
// line/column are 1-based; 0 means "not known yet" (the evaluator fills in
// the position of the node being evaluated).
struct TemplateError : std::exception {
  TemplateError(StatusCode c, std::string m) : code(c), message(std::move(m)) {}
  const char* what() const noexcept override { return message.c_str(); }
  StatusCode code;
  std::string message;
  int line = 0;
  int column = 0;
};

[[noreturn]] void fail(std::string message);                   // kInvalidArgument
[[noreturn]] void fail_limit(std::string message);             // kResourceExhausted

class Value;
class Interpreter;

struct List {
  std::vector<Value> items;
  bool is_tuple = false;
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, unique keys
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);  // replaces in place or appends
};

struct Namespace;

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* kwarg(std::string_view name) const;
};

struct Callable {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

struct Undefined {
  std::string hint;  // the error raised when it is used, e.g. "'name' is undefined"
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable, kNamespace };

  Value() : v_(Undefined{}) {}
  // hint: the message of the error raised when the value is used.
  static Value undefined(std::string hint = {}) { return Value(Undefined{std::move(hint)}); }
  static Value none() { return Value(nullptr); }
  Value(bool b) : v_(b) {}  // NOLINT
  Value(int64_t i) : v_(i) {}  // NOLINT
  Value(int i) : v_(int64_t{i}) {}  // NOLINT
  Value(double d) : v_(d) {}  // NOLINT
  Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}  // NOLINT
  Value(std::shared_ptr<const List> l) : v_(std::move(l)) {}  // NOLINT
  Value(std::shared_ptr<const Dict> d) : v_(std::move(d)) {}  // NOLINT
  Value(std::shared_ptr<const Callable> c) : v_(std::move(c)) {}  // NOLINT
  Value(std::shared_ptr<Namespace> n) : v_(std::move(n)) {}  // NOLINT

  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value dict(Dict d);
  static Value callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);
  static Value from_json(const nlohmann::json& j);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_callable() const { return kind() == Kind::kCallable; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // Numeric value of int, float or bool as double.
  double to_double() const;
  const std::string& as_string() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
  const List& as_list() const { return *std::get<std::shared_ptr<const List>>(v_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<const Dict>>(v_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<const Callable>>(v_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }
  const void* identity() const;  // for `is sameas` on containers

  bool truthy() const;
  std::string str() const;   // Python str(); undefined -> ""
  std::string repr() const;  // Python repr()
  const char* type_name() const;

 private:
  explicit Value(Undefined u) : v_(std::move(u)) {}
  explicit Value(std::nullptr_t) : v_(nullptr) {}
  // Strings are shared too, so that copying lists of long strings stays cheap.
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<const List>,
               std::shared_ptr<const Dict>, std::shared_ptr<const Callable>, std::shared_ptr<Namespace>>
      v_;
};

struct Namespace {
  Dict attrs;
};

// Python ==, and ordering (<0, 0, >0) for <, sort; ordering fails for
// incomparable types as Python does.
bool values_equal(const Value& a, const Value& b);
int compare_values(const Value& a, const Value& b);

// Python float repr: shortest round-trip digits, "1.0", "1e+16", "inf", "nan".
std::string format_float(double d);
// Python repr of a str: quotes chosen as Python does, escapes non-printables.
std::string repr_string(std::string_view s);

// json.dumps(x, ensure_ascii, indent, separators, sort_keys) as Python writes it.
struct JsonOptions {
  bool ensure_ascii = false;
  int indent = -1;  // -1: none; else spaces (an indent string may be given instead)
  std::string indent_str;
  bool has_indent = false;
  std::string item_sep;  // defaults: ", " without indent, "," with indent
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& opts);

// UTF-8 helpers: Python str indexes code points.
std::vector<uint32_t> utf8_decode(std::string_view s);
void utf8_append(std::string& out, uint32_t cp);
size_t utf8_length(std::string_view s);

}  // namespace osprey::jinja
