// Builtin filters (jinja2 3.1 semantics; tojson as transformers overrides it).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/py_string.h"

namespace osprey::jinja {
namespace {

Value list_value(Interpreter& in, std::vector<Value> items) {
  in.check_list_size(items.size());
  in.step(static_cast<int64_t>(items.size()));
  return Value::list(std::move(items));
}

// Dotted attribute path ("a.b" or "0") as jinja's make_attrgetter resolves it.
Value get_path(Interpreter& in, const Value& v, const Value& path) {
  if (path.is_int()) return in.get_item(v, path);
  std::string p = path.str();
  Value cur = v;
  size_t start = 0;
  while (true) {
    size_t dot = p.find('.', start);
    std::string part = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = numeric ? in.get_item(cur, Value(static_cast<int64_t>(std::stoll(part.substr(0, 18)))))
                  : in.get_item(cur, Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  JsonOptions o;
  o.ensure_ascii = arg_or(a, 0, "ensure_ascii", Value(false)).truthy();
  Value indent = arg_or(a, 1, "indent", Value::none());
  if (indent.is_int() || indent.is_bool()) {
    o.has_indent = true;
    o.indent_str = std::string(static_cast<size_t>(std::clamp<int64_t>(to_int(indent, "indent"), 0, 64)), ' ');
  } else if (indent.is_string()) {
    o.has_indent = true;
    o.indent_str = indent.as_string();
  } else if (!indent.is_none()) {
    fail("tojson indent must be an int or str");
  }
  o.item_sep = o.has_indent ? "," : ", ";
  Value seps = arg_or(a, 2, "separators", Value::none());
  if (seps.is_list() && seps.as_list().items.size() == 2) {
    o.item_sep = require_string(seps.as_list().items[0], "separator");
    o.key_sep = require_string(seps.as_list().items[1], "separator");
  } else if (!seps.is_none()) {
    fail("tojson separators must be a (item, key) pair");
  }
  o.sort_keys = arg_or(a, 3, "sort_keys", Value(false)).truthy();
  return make_string(in, to_json(v, o));
}

Value f_trim(Interpreter& in, const Value& v, CallArgs& a) {
  return make_string(in, py_strip(v.str(), opt_string(arg_or(a, 0, "chars", Value::none()), "chars"), true, true));
}
Value f_length(Interpreter&, const Value& v, CallArgs&) { return Value(py_len(v)); }

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  std::string sep = arg_or(a, 0, "d", Value("")).str();
  Value attr = arg_or(a, 1, "attribute", Value::none());
  std::string out;
  bool first = true;
  for (const auto& item : in.iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += attr.is_none() ? item.str() : get_path(in, item, attr).str();
    in.check_string_size(out.size());
  }
  return make_string(in, std::move(out));
}

Value f_items(Interpreter& in, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& kv : v.as_dict().items) out.push_back(Value::list({Value(kv.first), kv.second}, true));
  return list_value(in, std::move(out));
}

Value f_upper(Interpreter& in, const Value& v, CallArgs&) { return make_string(in, py_upper(v.str())); }
Value f_lower(Interpreter& in, const Value& v, CallArgs&) { return make_string(in, py_lower(v.str())); }
Value f_capitalize(Interpreter& in, const Value& v, CallArgs&) { return make_string(in, py_capitalize(v.str())); }

// jinja's title: capitalise each run split at [-\s({\[<]+.
Value f_title(Interpreter& in, const Value& v, CallArgs&) {
  std::string out;
  bool word_start = true;
  for (uint32_t cp : utf8_decode(v.str())) {
    bool sep = py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    std::string c;
    utf8_append(c, cp);
    out += sep ? c : (word_start ? py_upper(c) : py_lower(c));
    word_start = sep;
  }
  return make_string(in, std::move(out));
}

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  std::string old = arg_or(a, 0, "old", Value("")).str();
  std::string repl = arg_or(a, 1, "new", Value("")).str();
  Value count_v = arg_or(a, 2, "count", Value::none());
  int64_t count = count_v.is_none() ? -1 : to_int(count_v, "count");
  auto r = py_replace(v.str(), old, repl, count, in.limits().max_output_bytes);
  if (!r) fail_limit("template string value exceeded max_output_bytes");
  return make_string(in, std::move(*r));
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  Value def = arg_or(a, 0, "default_value", Value(""));
  bool boolean = arg_or(a, 1, "boolean", Value(false)).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return def;
  return v;
}

Value f_first(Interpreter& in, const Value& v, CallArgs&) {
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}
Value f_last(Interpreter& in, const Value& v, CallArgs&) {
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}
Value f_list(Interpreter& in, const Value& v, CallArgs&) { return list_value(in, in.iterate(v)); }
Value f_string(Interpreter& in, const Value& v, CallArgs&) { return make_string(in, v.str()); }

std::optional<int64_t> parse_int(std::string s, int base) {
  s = py_strip(s, std::nullopt, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long r = std::strtoll(s.c_str(), &end, base);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return r;
}
std::optional<double> parse_float(std::string s) {
  s = py_strip(s, std::nullopt, true, true);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return d;
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  Value def = arg_or(a, 0, "default", Value(0));
  int base = static_cast<int>(std::clamp<int64_t>(to_int(arg_or(a, 1, "base", Value(10)), "base"), 0, 36));
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(int64_t{v.as_bool()});
  if (v.is_float()) {
    double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return def;
    return Value(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    if (auto i = parse_int(v.as_string(), base)) return Value(*i);
    if (auto d = parse_float(v.as_string()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18)
      return Value(static_cast<int64_t>(*d));
  }
  return def;
}
Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  Value def = arg_or(a, 0, "default", Value(0.0));
  if (v.is_number()) return Value(v.to_double());
  if (v.is_string())
    if (auto d = parse_float(v.as_string())) return Value(*d);
  return def;
}
Value f_abs(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  int64_t i = to_int(v, "abs() argument");
  if (i == INT64_MIN) fail("integer overflow");
  return Value(i < 0 ? -i : i);
}

// Python round(x, n): the exact binary value rounded half-even; glibc's
// correctly rounded "%.*f" gives the same digits.
double py_round(double x, int64_t ndigits) {
  if (!std::isfinite(x) || ndigits > 300) return x;
  if (ndigits >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(ndigits, 300)), x);
    return std::strtod(buf, nullptr);
  }
  double p = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / p) * p;
}
Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  int64_t precision = to_int(arg_or(a, 0, "precision", Value(0)), "precision");
  std::string method = arg_or(a, 1, "method", Value("common")).str();
  if (!v.is_number()) fail("round() requires a number");
  double x = v.to_double();
  if (method == "common") {
    if (v.is_int() || v.is_bool()) return v.is_bool() ? Value(int64_t{v.as_bool()}) : v;
    return Value(py_round(x, precision));
  }
  double p = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return Value(std::ceil(x * p) / p);
  if (method == "floor") return Value(std::floor(x * p) / p);
  fail("method must be common, ceil or floor");
}

// map/select helpers: "filter name" positional form or attribute= form.
Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  if (const Value* attr = a.kwarg("attribute")) {
    const Value* def = a.kwarg("default");
    for (const auto& item : in.iterate(v)) {
      Value r = get_path(in, item, *attr);
      out.push_back(r.is_undefined() && def ? *def : r);
    }
    return list_value(in, std::move(out));
  }
  if (a.pos.empty()) fail("map requires a filter name or attribute=");
  std::string name = require_string(a.pos[0], "map filter name");
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const auto& item : in.iterate(v)) {
    CallArgs copy = rest;
    out.push_back(in.apply_filter(name, item, copy));
  }
  return list_value(in, std::move(out));
}

Value select_impl(Interpreter& in, const Value& v, CallArgs& a, bool by_attr, bool keep_if) {
  size_t k = 0;
  Value attr;
  if (by_attr) {
    if (a.pos.empty()) fail("selectattr requires an attribute name");
    attr = a.pos[k++];
  }
  std::string test;
  if (k < a.pos.size()) test = require_string(a.pos[k++], "test name");
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(std::min(k, a.pos.size())), a.pos.end());
  rest.kw = a.kw;
  std::vector<Value> out;
  for (const auto& item : in.iterate(v)) {
    Value x = by_attr ? get_path(in, item, attr) : item;
    bool r;
    if (test.empty()) {
      r = x.truthy();
    } else {
      CallArgs copy = rest;
      r = in.apply_test(test, x, copy);
    }
    if (r == keep_if) out.push_back(item);
  }
  return list_value(in, std::move(out));
}
Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, false); }

// Sort/unique key: optional attribute, strings lowered unless case_sensitive.
Value sort_key(Interpreter& in, const Value& item, const Value& attr, bool case_sensitive) {
  Value k = attr.is_none() ? item : get_path(in, item, attr);
  if (!case_sensitive && k.is_string()) return Value(py_lower(k.as_string()));
  return k;
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  bool cs = arg_or(a, 0, "case_sensitive", Value(false)).truthy();
  Value attr = arg_or(a, 1, "attribute", Value::none());
  std::vector<Value> out, seen;
  for (const auto& item : in.iterate(v)) {
    Value k = sort_key(in, item, attr, cs);
    bool dup = false;
    for (const auto& s : seen) {
      in.step();
      if (values_equal(s, k)) {
        dup = true;
        break;
      }
    }
    if (!dup) {
      seen.push_back(k);
      out.push_back(item);
    }
  }
  return list_value(in, std::move(out));
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  bool reverse = arg_or(a, 0, "reverse", Value(false)).truthy();
  bool cs = arg_or(a, 1, "case_sensitive", Value(false)).truthy();
  Value attr = arg_or(a, 2, "attribute", Value::none());
  std::vector<Value> items = in.iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& it : items) keyed.emplace_back(sort_key(in, it, attr, cs), it);
  in.step(static_cast<int64_t>(keyed.size()) * 20);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare_values(y.first, x.first) < 0 : compare_values(x.first, y.first) < 0;
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(kv.second);
  return list_value(in, std::move(out));
}

Value f_dictsort(Interpreter& in, const Value& v, CallArgs& a) {
  if (!v.is_dict()) fail("dictsort requires a mapping");
  bool cs = arg_or(a, 0, "case_sensitive", Value(false)).truthy();
  std::string by = arg_or(a, 1, "by", Value("key")).str();
  bool reverse = arg_or(a, 2, "reverse", Value(false)).truthy();
  size_t pos = by == "key" ? 0 : by == "value" ? 1 : 2;
  if (pos == 2) fail("You can only sort by either \"key\" or \"value\"");
  std::vector<Value> out;
  for (const auto& kv : v.as_dict().items) out.push_back(Value::list({Value(kv.first), kv.second}, true));
  auto key = [&](const Value& pair) {
    const Value& k = pair.as_list().items[pos];
    return (!cs && k.is_string()) ? Value(py_lower(k.as_string())) : k;
  };
  in.step(static_cast<int64_t>(out.size()) * 20);
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    return reverse ? compare_values(key(y), key(x)) < 0 : compare_values(key(x), key(y)) < 0;
  });
  return list_value(in, std::move(out));
}

Value f_reverse(Interpreter& in, const Value& v, CallArgs&) {
  if (v.is_string()) {
    auto cps = utf8_decode(v.as_string());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) utf8_append(out, *it);
    return make_string(in, std::move(out));
  }
  auto items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return list_value(in, std::move(items));
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  Value width = arg_or(a, 0, "width", Value(4));
  bool first = arg_or(a, 1, "first", Value(false)).truthy();
  bool blank = arg_or(a, 2, "blank", Value(false)).truthy();
  std::string ind = width.is_string()
                        ? width.as_string()
                        : std::string(static_cast<size_t>(std::clamp<int64_t>(to_int(width, "width"), 0, 1024)), ' ');
  std::string s = v.str() + "\n";
  auto lines = py_splitlines(s, false);
  std::string out;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) out += "\n" + ind;
      out += lines[i];
      in.check_string_size(out.size());
    }
  } else {
    out = lines.empty() ? std::string() : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      out += "\n";
      if (!lines[i].empty()) out += ind;
      out += lines[i];
      in.check_string_size(out.size());
    }
  }
  if (first) out = ind + out;
  return make_string(in, std::move(out));
}

Value f_safe(Interpreter&, const Value& v, CallArgs&) { return v; }
Value f_escape(Interpreter& in, const Value& v, CallArgs&) {
  std::string out;
  for (char c : v.str()) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return make_string(in, std::move(out));
}
Value f_wordcount(Interpreter&, const Value& v, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (uint32_t cp : utf8_decode(v.str())) {
    bool w = py_isalnum(cp) || cp == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}
Value f_batch(Interpreter& in, const Value& v, CallArgs& a) {
  int64_t count = to_int(arg_or(a, 0, "linecount", Value::none()), "linecount");
  if (count <= 0) fail("batch linecount must be positive");
  Value fill = arg_or(a, 1, "fill_with", Value::none());
  std::vector<Value> out, cur;
  for (const auto& item : in.iterate(v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == count) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (!fill.is_none())
      while (static_cast<int64_t>(cur.size()) < count) {
        in.step();
        cur.push_back(fill);
      }
    out.push_back(Value::list(std::move(cur)));
  }
  return list_value(in, std::move(out));
}
Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  Value attr = arg_or(a, 0, "attribute", Value::none());
  Value total = arg_or(a, 1, "start", Value(0));
  for (const auto& item : in.iterate(v)) total = arithmetic(in, "+", total, attr.is_none() ? item : get_path(in, item, attr));
  return total;
}
Value minmax(Interpreter& in, const Value& v, CallArgs& a, bool want_max) {
  bool cs = arg_or(a, 0, "case_sensitive", Value(false)).truthy();
  Value attr = arg_or(a, 1, "attribute", Value::none());
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  Value best = items[0];
  for (size_t i = 1; i < items.size(); ++i) {
    int c = compare_values(sort_key(in, items[i], attr, cs), sort_key(in, best, attr, cs));
    if (want_max ? c > 0 : c < 0) best = items[i];
  }
  return best;
}
Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return minmax(in, v, a, true); }
Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return minmax(in, v, a, false); }
Value f_center(Interpreter& in, const Value& v, CallArgs& a) {
  int64_t width = std::min<int64_t>(to_int(arg_or(a, 0, "width", Value(80)), "width"), 1 << 16);
  std::string s = v.str();
  int64_t len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return make_string(in, s);
  int64_t pad = width - len;
  int64_t left = pad / 2 + (pad & width & 1);
  return make_string(in, std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(pad - left), ' '));
}
Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  Value args = a.kw.empty() ? Value::list(a.pos, true) : Value::none();
  if (!a.kw.empty()) {
    Dict d;
    for (auto& kv : a.kw) d.set(kv.first, kv.second);
    args = Value::dict(std::move(d));
  }
  return make_string(in, percent_format(in, v.str(), args));
}
Value f_attr(Interpreter& in, const Value& v, CallArgs& a) {
  std::string name = require_string(arg_or(a, 0, "name", Value::none()), "attribute name");
  if (v.is_dict()) {
    if (!name.empty() && name[0] == '_') return Value::undefined();
    Value m = bound_method(in, v, name);
    return m.is_undefined() ? Value::undefined("'dict object' has no attribute '" + name + "'") : m;
  }
  return in.get_attr(v, name);
}
Value f_pprint(Interpreter& in, const Value& v, CallArgs&) { return make_string(in, v.repr()); }

}  // namespace

FilterFn find_filter(const std::string& name) {
  static const std::unordered_map<std::string, FilterFn> kFilters = {
      {"tojson", f_tojson},       {"trim", f_trim},           {"length", f_length},
      {"count", f_length},        {"join", f_join},           {"items", f_items},
      {"upper", f_upper},         {"lower", f_lower},         {"capitalize", f_capitalize},
      {"title", f_title},         {"replace", f_replace},     {"default", f_default},
      {"d", f_default},           {"first", f_first},         {"last", f_last},
      {"list", f_list},           {"string", f_string},       {"int", f_int},
      {"float", f_float},         {"abs", f_abs},             {"round", f_round},
      {"map", f_map},             {"select", f_select},       {"reject", f_reject},
      {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr}, {"unique", f_unique},
      {"sort", f_sort},           {"reverse", f_reverse},     {"dictsort", f_dictsort},
      {"indent", f_indent},       {"safe", f_safe},           {"escape", f_escape},
      {"e", f_escape},            {"forceescape", f_escape},  {"wordcount", f_wordcount},
      {"batch", f_batch},         {"sum", f_sum},             {"max", f_max},
      {"min", f_min},             {"center", f_center},       {"format", f_format},
      {"attr", f_attr},           {"pprint", f_pprint},
  };
  auto it = kFilters.find(name);
  return it == kFilters.end() ? nullptr : it->second;
}

}  // namespace osprey::jinja
