// Globals, arithmetic, membership, %-formatting and the `is` tests.
#include "tokenizer/jinja/builtins.h"

#include <cmath>
#include <ctime>
#include <limits>
#include <unordered_map>

#include "tokenizer/jinja/py_string.h"

namespace osprey::jinja {

Value arg_or(const CallArgs& a, size_t i, const char* name, Value def) {
  if (i < a.pos.size()) return a.pos[i];
  if (const Value* v = a.kwarg(name)) return *v;
  return def;
}

int64_t to_int(const Value& v, const char* what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  fail(std::string(what) + " must be an integer, not '" + v.type_name() + "'");
}

std::optional<std::string> opt_string(const Value& v, const char* what) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  if (v.is_string()) return v.as_string();
  fail(std::string(what) + " must be None or a string, not '" + v.type_name() + "'");
}

std::string require_string(const Value& v, const char* what) {
  if (v.is_string()) return v.as_string();
  fail(std::string(what) + " must be a string, not '" + v.type_name() + "'");
}

Value make_string(Interpreter& in, std::string s) {
  in.check_string_size(s.size());
  in.step(static_cast<int64_t>(s.size() / 64));
  return Value(std::move(s));
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(utf8_length(v.as_string()));
    case Value::Kind::kList: return static_cast<int64_t>(v.as_list().items.size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.as_dict().items.size());
    default: fail(std::string("object of type '") + v.type_name() + "' has no len()");
  }
}

// ---- arithmetic ----
namespace {

[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail(a.undefined_hint().empty() ? "value is undefined" : a.undefined_hint());
  if (b.is_undefined()) fail(b.undefined_hint().empty() ? "value is undefined" : b.undefined_hint());
  fail("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
}

int64_t int_of(const Value& v) { return v.is_bool() ? v.as_bool() : v.as_int(); }

Value repeat(Interpreter& in, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && static_cast<uint64_t>(n) > in.limits().max_output_bytes / s.size())
      fail_limit("template string value exceeded max_output_bytes");
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return make_string(in, std::move(out));
  }
  const auto& items = seq.as_list().items;
  if (!items.empty() && static_cast<uint64_t>(n) > static_cast<uint64_t>(in.limits().max_loop_iterations) / items.size())
    fail_limit("template list value exceeded max_loop_iterations items");
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  in.step(static_cast<int64_t>(out.size()));
  return Value::list(std::move(out), seq.as_list().is_tuple);
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

Value arithmetic(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(int_of(a), int_of(b), &r)) fail("integer overflow");
      return Value(r);
    }
    if (nums) return Value(a.to_double() + b.to_double());
    if (a.is_string() && b.is_string()) return make_string(in, a.as_string() + b.as_string());
    if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
      in.check_list_size(a.as_list().items.size() + b.as_list().items.size());
      std::vector<Value> out = a.as_list().items;
      out.insert(out.end(), b.as_list().items.begin(), b.as_list().items.end());
      in.step(static_cast<int64_t>(out.size()));
      return Value::list(std::move(out), a.as_list().is_tuple);
    }
    bad_operands(op, a, b);
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(int_of(a), int_of(b), &r)) fail("integer overflow");
      return Value(r);
    }
    if (nums) return Value(a.to_double() - b.to_double());
    bad_operands(op, a, b);
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(int_of(a), int_of(b), &r)) fail("integer overflow");
      return Value(r);
    }
    if (nums) return Value(a.to_double() * b.to_double());
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(in, a, int_of(b));
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(in, b, int_of(a));
    bad_operands(op, a, b);
  }
  if (op == "/") {
    if (!nums) bad_operands(op, a, b);
    if (b.to_double() == 0) fail("division by zero");
    return Value(a.to_double() / b.to_double());
  }
  if (op == "//") {
    if (!nums) bad_operands(op, a, b);
    if (ints) {
      if (int_of(b) == 0) fail("integer division or modulo by zero");
      if (int_of(a) == INT64_MIN && int_of(b) == -1) fail("integer overflow");
      return Value(floor_div(int_of(a), int_of(b)));
    }
    if (b.to_double() == 0) fail("float floor division by zero");
    return Value(std::floor(a.to_double() / b.to_double()));
  }
  if (op == "%") {
    if (a.is_string()) return make_string(in, percent_format(in, a.as_string(), b));
    if (!nums) bad_operands(op, a, b);
    if (ints) {
      int64_t x = int_of(a), y = int_of(b);
      if (y == 0) fail("integer division or modulo by zero");
      if (y == -1) return Value(int64_t{0});
      int64_t r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value(r);
    }
    double x = a.to_double(), y = b.to_double();
    if (y == 0) fail("float modulo");
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value(r);
  }
  if (op == "**") {
    if (!nums) bad_operands(op, a, b);
    if (ints && int_of(b) >= 0) {
      int64_t base = int_of(a), e = int_of(b), r = 1;
      while (e > 0) {
        if (e & 1)
          if (__builtin_mul_overflow(r, base, &r)) fail("integer overflow");
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow");
      }
      return Value(r);
    }
    if (a.to_double() == 0 && b.to_double() < 0) fail("0.0 cannot be raised to a negative power");
    return Value(std::pow(a.to_double(), b.to_double()));
  }
  fail("unknown operator " + op);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string())
        fail(std::string("'in <string>' requires string as left operand, not ") + item.type_name());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const auto& v : container.as_list().items)
        if (values_equal(v, item)) return true;
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    default:
      fail(std::string("argument of type '") + container.type_name() + "' is not iterable");
  }
}

std::string percent_format(Interpreter& in, const std::string& fmt, const Value& args) {
  std::vector<Value> list;
  const Dict* mapping = nullptr;
  if (args.is_list() && args.as_list().is_tuple) list = args.as_list().items;
  else if (args.is_dict()) mapping = &args.as_dict();
  else list.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    if (fmt[i] == '%') {
      out += '%';
      continue;
    }
    const Value* v = nullptr;
    if (fmt[i] == '(' && mapping) {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos) fail("incomplete format key");
      v = mapping->find(fmt.substr(i + 1, close - i - 1));
      if (!v) fail("format key not found");
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string("-+ #0123456789.").find(fmt[i]) != std::string::npos) flags += fmt[i++];
    if (i >= fmt.size()) fail("incomplete format");
    char conv = fmt[i];
    if (!v) {
      if (next >= list.size()) fail("not enough arguments for format string");
      v = &list[next++];
    }
    char buf[512];
    std::string spec = "%" + flags;
    if (flags.size() > 20) fail("format spec too long");
    switch (conv) {
      case 's': out += v->str(); break;
      case 'r': case 'a': out += v->repr(); break;
      case 'd': case 'i': case 'u': {
        if (!v->is_number()) fail("%d format: a real number is required, not " + std::string(v->type_name()));
        int64_t n = v->is_float() ? static_cast<int64_t>(v->as_float()) : int_of(*v);
        std::snprintf(buf, sizeof(buf), (spec + "lld").c_str(), static_cast<long long>(n));
        out += buf;
        break;
      }
      case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
        if (!v->is_number()) fail("must be real number, not " + std::string(v->type_name()));
        std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), v->to_double());
        out += buf;
        break;
      }
      case 'x': case 'X': case 'o': {
        if (!v->is_int() && !v->is_bool()) fail("%x format: an integer is required");
        std::snprintf(buf, sizeof(buf), (spec + "ll" + conv).c_str(), static_cast<long long>(int_of(*v)));
        out += buf;
        break;
      }
      default: fail(std::string("unsupported format character '") + conv + "'");
    }
    in.check_string_size(out.size());
  }
  if (next < list.size() && !mapping) fail("not all arguments converted during string formatting");
  return out;
}

// ---- globals ----
void install_globals(Interpreter& in) {
  in.set_global("range", Value::callable("range", [](Interpreter& in, CallArgs& a) -> Value {
    if (a.pos.empty() || a.pos.size() > 3 || !a.kw.empty()) fail("range expected 1 to 3 integer arguments");
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) {
      stop = to_int(a.pos[0], "range() argument");
    } else {
      start = to_int(a.pos[0], "range() argument");
      stop = to_int(a.pos[1], "range() argument");
      if (a.pos.size() == 3) step = to_int(a.pos[2], "range() argument");
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    long double count = 0;
    if (step > 0 && stop > start) count = std::ceil((static_cast<long double>(stop) - start) / step);
    if (step < 0 && stop < start) count = std::ceil((static_cast<long double>(start) - stop) / -static_cast<long double>(step));
    if (count > static_cast<long double>(in.limits().max_loop_iterations))
      fail_limit("range() too large for max_loop_iterations");
    std::vector<Value> out;
    out.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) out.emplace_back(start + i * step);
    in.step(static_cast<int64_t>(out.size()));
    return Value::list(std::move(out));
  }));
  auto make_dict = [](CallArgs& a, const char* what) {
    Dict d;
    if (a.pos.size() > 1) fail(std::string(what) + " expected at most 1 positional argument");
    if (!a.pos.empty()) {
      if (a.pos[0].is_dict()) d = a.pos[0].as_dict();
      else if (!a.pos[0].is_none()) fail(std::string(what) + " argument must be a mapping");
    }
    for (auto& kv : a.kw) d.set(kv.first, kv.second);
    return d;
  };
  in.set_global("namespace", Value::callable("namespace", [make_dict](Interpreter&, CallArgs& a) -> Value {
    auto ns = std::make_shared<Namespace>();
    ns->attrs = make_dict(a, "namespace");
    for (const auto& kv : ns->attrs.items)
      if (!kv.first.empty() && kv.first[0] == '_')
        fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + kv.first + "'.");
    return Value(std::move(ns));
  }));
  in.set_global("dict", Value::callable("dict", [make_dict](Interpreter&, CallArgs& a) -> Value {
    return Value::dict(make_dict(a, "dict"));
  }));
  in.set_global("raise_exception", Value::callable("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
    fail(a.pos.empty() ? std::string() : a.pos[0].str());
  }));
  in.set_global("strftime_now", Value::callable("strftime_now", [](Interpreter& in, CallArgs& a) -> Value {
    std::string fmt = require_string(arg_or(a, 0, "format", Value::none()), "strftime_now format");
    if (fmt.size() > 256) fail("strftime format too long");
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[1024];
    size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
    return make_string(in, std::string(buf, n));
  }));
}

// ---- tests ----
namespace {

bool test_defined(Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool test_undefined(Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool test_none(Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }
bool test_boolean(Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }
bool test_false(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool test_true(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool test_integer(Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }
bool test_float(Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }
bool test_number(Interpreter&, const Value& v, CallArgs&) { return v.is_number(); }
bool test_string(Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }
bool test_mapping(Interpreter&, const Value& v, CallArgs&) { return v.is_dict(); }
bool test_iterable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool test_sequence(Interpreter&, const Value& v, CallArgs&) { return v.is_string() || v.is_list() || v.is_dict(); }
bool test_callable(Interpreter&, const Value& v, CallArgs&) { return v.is_callable(); }
bool test_odd(Interpreter&, const Value& v, CallArgs&) { return to_int(v, "value") % 2 != 0; }
bool test_even(Interpreter&, const Value& v, CallArgs&) { return to_int(v, "value") % 2 == 0; }
bool test_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  int64_t d = to_int(arg_or(a, 0, "num", Value::none()), "divisibleby argument");
  if (d == 0) fail("integer division or modulo by zero");
  return to_int(v, "value") % d == 0;
}
const Value& other(const CallArgs& a) {
  if (a.pos.empty()) fail("test expects one argument");
  return a.pos[0];
}
bool test_eq(Interpreter&, const Value& v, CallArgs& a) { return values_equal(v, other(a)); }
bool test_ne(Interpreter&, const Value& v, CallArgs& a) { return !values_equal(v, other(a)); }
bool test_lt(Interpreter&, const Value& v, CallArgs& a) { return compare_values(v, other(a)) < 0; }
bool test_le(Interpreter&, const Value& v, CallArgs& a) { return compare_values(v, other(a)) <= 0; }
bool test_gt(Interpreter&, const Value& v, CallArgs& a) { return compare_values(v, other(a)) > 0; }
bool test_ge(Interpreter&, const Value& v, CallArgs& a) { return compare_values(v, other(a)) >= 0; }
bool test_in(Interpreter&, const Value& v, CallArgs& a) { return contains(other(a), v); }
bool test_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value& o = other(a);
  if (v.kind() != o.kind()) return false;
  if (v.identity()) return v.identity() == o.identity();
  return values_equal(v, o);  // None/True/False are singletons; scalars approximate `is`
}
bool test_lower(Interpreter&, const Value& v, CallArgs&) {
  std::string s = v.str();
  return py_lower(s) == s;
}
bool test_upper(Interpreter&, const Value& v, CallArgs&) {
  std::string s = v.str();
  return py_upper(s) == s;
}
bool test_escaped(Interpreter&, const Value&, CallArgs&) { return false; }
bool test_filter(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && find_filter(v.as_string()); }
bool test_test(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && find_test(v.as_string()); }

}  // namespace

TestFn find_test(const std::string& name) {
  static const std::unordered_map<std::string, TestFn> kTests = {
      {"defined", test_defined},   {"undefined", test_undefined}, {"none", test_none},
      {"boolean", test_boolean},   {"false", test_false},         {"true", test_true},
      {"integer", test_integer},   {"float", test_float},         {"number", test_number},
      {"string", test_string},     {"mapping", test_mapping},     {"iterable", test_iterable},
      {"sequence", test_sequence}, {"callable", test_callable},   {"odd", test_odd},
      {"even", test_even},         {"divisibleby", test_divisibleby}, {"eq", test_eq},
      {"equalto", test_eq},        {"==", test_eq},               {"ne", test_ne},
      {"!=", test_ne},             {"lt", test_lt},               {"lessthan", test_lt},
      {"<", test_lt},              {"le", test_le},               {"<=", test_le},
      {"gt", test_gt},             {"greaterthan", test_gt},      {">", test_gt},
      {"ge", test_ge},             {">=", test_ge},               {"in", test_in},
      {"sameas", test_sameas},     {"lower", test_lower},         {"upper", test_upper},
      {"escaped", test_escaped},   {"filter", test_filter},       {"test", test_test},
  };
  auto it = kTests.find(name);
  return it == kTests.end() ? nullptr : it->second;
}

}  // namespace osprey::jinja
