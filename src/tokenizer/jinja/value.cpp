#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <utf8proc.h>

namespace osprey::jinja {

void fail(std::string message) { throw TemplateError(StatusCode::kInvalidArgument, std::move(message)); }
void fail_limit(std::string message) { throw TemplateError(StatusCode::kResourceExhausted, std::move(message)); }

const Value* Dict::find(std::string_view key) const {
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  for (auto& kv : items) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* CallArgs::kwarg(std::string_view name) const {
  for (const auto& kv : kw)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  l->is_tuple = is_tuple;
  return Value(std::shared_ptr<const List>(std::move(l)));
}

Value Value::dict(Dict d) { return Value(std::shared_ptr<const Dict>(std::make_shared<Dict>(std::move(d)))); }

Value Value::callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return Value(std::shared_ptr<const Callable>(std::move(c)));
}

namespace {
template <class J>
Value from_json_impl(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_impl(e));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), from_json_impl(it.value()));
      return Value::dict(std::move(d));
    }
    default:
      return Value::none();  // binary / discarded: not produced by JSON parsing
  }
}
}  // namespace

Value Value::from_json(const nlohmann::json& j) { return from_json_impl(j); }
Value Value::from_json(const nlohmann::ordered_json& j) { return from_json_impl(j); }

double Value::to_double() const {
  if (is_int()) return static_cast<double>(as_int());
  if (is_float()) return as_float();
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  return 0.0;
}

const void* Value::identity() const {
  switch (kind()) {
    case Kind::kList: return &as_list();
    case Kind::kDict: return &as_dict();
    case Kind::kCallable: return &as_callable();
    case Kind::kNamespace: return &as_namespace();
    default: return nullptr;
  }
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return as_bool();
    case Kind::kInt: return as_int() != 0;
    case Kind::kFloat: return as_float() != 0.0;
    case Kind::kString: return !as_string().empty();
    case Kind::kList: return !as_list().items.empty();
    case Kind::kDict: return !as_dict().items.empty();
    default: return true;
  }
}

const char* Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return as_list().is_tuple ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kCallable: return "function";
    case Kind::kNamespace: return "Namespace";
  }
  return "object";
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string s(buf, r.ptr);  // [-]d[.ddd]e(+|-)XX
  bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  int exp = std::stoi(s.substr(e + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out = neg ? "-" : "";
  if (exp >= 16 || exp < -4) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    size_t int_len = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_len) {
      out += digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return out;
}

std::vector<uint32_t> utf8_decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp = 0;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                              static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {  // invalid byte: keep it as U+FFFD-free raw byte value
      out.push_back(static_cast<unsigned char>(s[i]) | 0x80000000u);
      ++i;
    } else {
      out.push_back(static_cast<uint32_t>(cp));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp & 0x80000000u) {  // raw invalid byte carried through decode
    out.push_back(static_cast<char>(cp & 0xFF));
    return;
  }
  utf8proc_uint8_t buf[4];
  auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

namespace {
bool is_printable(uint32_t cp) {
  if (cp == ' ') return true;
  if (cp & 0x80000000u) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}
}  // namespace

std::string repr_string(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t cp : utf8_decode(s)) {
    char buf[16];
    if (cp == static_cast<uint32_t>(q) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp & 0x80000000u) {  // Python would hold a surrogate escape; show the byte
      std::snprintf(buf, sizeof(buf), "\\udc%02x", cp & 0xFF);
      out += buf;
    } else if (!is_printable(cp)) {
      if (cp < 0x100) std::snprintf(buf, sizeof(buf), "\\x%02x", cp);
      else if (cp < 0x10000) std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      else std::snprintf(buf, sizeof(buf), "\\U%08x", cp);
      out += buf;
    } else {
      utf8_append(out, cp);
    }
  }
  out += q;
  return out;
}

std::string Value::str() const {
  switch (kind()) {
    case Kind::kUndefined: return "";
    case Kind::kString: return as_string();
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "None";
    case Kind::kBool: return as_bool() ? "True" : "False";
    case Kind::kInt: return std::to_string(as_int());
    case Kind::kFloat: return format_float(as_float());
    case Kind::kString: return repr_string(as_string());
    case Kind::kList: {
      const List& l = as_list();
      std::string out = l.is_tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        out += l.items[i].repr();
      }
      if (l.is_tuple && l.items.size() == 1) out += ",";
      out += l.is_tuple ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& kv : as_dict().items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(kv.first) + ": " + kv.second.repr();
      }
      return out + "}";
    }
    case Kind::kCallable: return "<function " + as_callable().name + ">";
    case Kind::kNamespace: return "<Namespace " + Value::dict(as_namespace().attrs).repr() + ">";
  }
  return "";
}

bool values_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
    int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return a.as_string() == b.as_string();
    case K::kList: {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!values_equal(x.items[i], y.items[i])) return false;
      return true;
    }
    case K::kDict: {
      const auto& x = a.as_dict();
      const auto& y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& kv : x.items) {
        const Value* o = y.find(kv.first);
        if (!o || !values_equal(kv.second, *o)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

int compare_values(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) {
      int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
      int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    double x = a.to_double(), y = b.to_double();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order == code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_equal(x[i], y[i])) continue;
      return compare_values(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  fail(std::string("'<' not supported between instances of '") + a.type_name() + "' and '" + b.type_name() + "'");
}

namespace {
void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (uint32_t cp : utf8_decode(s)) {
    char buf[16];
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp & 0x80000000u) {  // invalid byte: Python holds a lone surrogate here
      std::snprintf(buf, sizeof(buf), "\\udc%02x", cp & 0xFF);
      if (ensure_ascii) out += buf;
      else out.push_back(static_cast<char>(cp & 0xFF));
    } else if (cp < 0x20) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      out += buf;
    } else if (cp >= 0x7f && ensure_ascii) {
      if (cp >= 0x10000) {
        uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      }
      out += buf;
    } else {
      utf8_append(out, cp);
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonOptions& o, int level) {
  auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += o.indent_str;
  };
  const std::string& item_sep = o.item_sep;
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      double d = v.as_float();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
      else out += format_float(d);
      return;
    }
    case Value::Kind::kString: json_string(out, v.as_string(), o.ensure_ascii); return;
    case Value::Kind::kList: {
      const auto& items = v.as_list().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (o.has_indent) newline(level + 1);
        json_value(out, items[i], o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.as_dict().items) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (o.has_indent) newline(level + 1);
        json_string(out, items[i]->first, o.ensure_ascii);
        out += o.key_sep;
        json_value(out, items[i]->second, o, level + 1);
      }
      if (o.has_indent) newline(level);
      out += '}';
      return;
    }
    default:
      fail(std::string("Object of type ") + v.type_name() + " is not JSON serializable");
  }
}
}  // namespace

std::string to_json(const Value& v, const JsonOptions& opts) {
  std::string out;
  json_value(out, v, opts, 0);
  return out;
}

}  // namespace osprey::jinja
