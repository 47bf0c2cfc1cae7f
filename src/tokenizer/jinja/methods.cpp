// Methods of str, list and dict values reachable from templates. Mutating
// methods (list.append, dict.update, ...) fail as ImmutableSandboxedEnvironment
// makes them fail.
#include <algorithm>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/py_string.h"

namespace osprey::jinja {
namespace {

using Method = Value (*)(Interpreter&, const Value& self, CallArgs&);

std::optional<std::string> chars_arg(const CallArgs& a) { return opt_string(arg_or(a, 0, "chars", Value::none()), "strip arg"); }

Value m_strip(Interpreter& in, const Value& s, CallArgs& a) { return make_string(in, py_strip(s.as_string(), chars_arg(a), true, true)); }
Value m_lstrip(Interpreter& in, const Value& s, CallArgs& a) { return make_string(in, py_strip(s.as_string(), chars_arg(a), true, false)); }
Value m_rstrip(Interpreter& in, const Value& s, CallArgs& a) { return make_string(in, py_strip(s.as_string(), chars_arg(a), false, true)); }

Value split_impl(Interpreter& in, const Value& s, CallArgs& a, bool right) {
  auto sep = opt_string(arg_or(a, 0, "sep", Value::none()), "separator");
  int64_t maxsplit = to_int(arg_or(a, 1, "maxsplit", Value(-1)), "maxsplit");
  std::vector<Value> out;
  for (auto& p : py_split(s.as_string(), sep, maxsplit, right)) out.emplace_back(std::move(p));
  in.step(static_cast<int64_t>(out.size()));
  in.check_list_size(out.size());
  return Value::list(std::move(out));
}
Value m_split(Interpreter& in, const Value& s, CallArgs& a) { return split_impl(in, s, a, false); }
Value m_rsplit(Interpreter& in, const Value& s, CallArgs& a) { return split_impl(in, s, a, true); }
Value m_splitlines(Interpreter& in, const Value& s, CallArgs& a) {
  bool keep = arg_or(a, 0, "keepends", Value(false)).truthy();
  std::vector<Value> out;
  for (auto& p : py_splitlines(s.as_string(), keep)) out.emplace_back(std::move(p));
  in.step(static_cast<int64_t>(out.size()));
  return Value::list(std::move(out));
}

bool affix(const Value& s, CallArgs& a, bool start) {
  Value p = arg_or(a, 0, "prefix", Value::none());
  std::vector<Value> cands = p.is_list() ? p.as_list().items : std::vector<Value>{p};
  std::string str = s.as_string();
  if (a.pos.size() > 1) {  // start/end bounds in code points
    std::vector<uint32_t> cps = utf8_decode(str);
    int64_t n = static_cast<int64_t>(cps.size());
    int64_t b = a.pos[1].is_none() ? 0 : to_int(a.pos[1], "start");
    int64_t e = (a.pos.size() > 2 && !a.pos[2].is_none()) ? to_int(a.pos[2], "end") : n;
    if (b < 0) b = std::max<int64_t>(0, b + n);
    if (e < 0) e = std::max<int64_t>(0, e + n);
    b = std::min(b, n);
    e = std::min(e, n);
    str.clear();
    for (int64_t i = b; i < e; ++i) utf8_append(str, cps[static_cast<size_t>(i)]);
  }
  for (const auto& c : cands) {
    std::string x = require_string(c, start ? "startswith arg" : "endswith arg");
    if (x.size() > str.size()) continue;
    if (start ? str.compare(0, x.size(), x) == 0 : str.compare(str.size() - x.size(), x.size(), x) == 0) return true;
  }
  return false;
}
Value m_startswith(Interpreter&, const Value& s, CallArgs& a) { return Value(affix(s, a, true)); }
Value m_endswith(Interpreter&, const Value& s, CallArgs& a) { return Value(affix(s, a, false)); }
Value m_upper(Interpreter& in, const Value& s, CallArgs&) { return make_string(in, py_upper(s.as_string())); }
Value m_lower(Interpreter& in, const Value& s, CallArgs&) { return make_string(in, py_lower(s.as_string())); }
Value m_title(Interpreter& in, const Value& s, CallArgs&) { return make_string(in, py_title(s.as_string())); }
Value m_capitalize(Interpreter& in, const Value& s, CallArgs&) { return make_string(in, py_capitalize(s.as_string())); }
Value m_replace(Interpreter& in, const Value& s, CallArgs& a) {
  std::string old = require_string(arg_or(a, 0, "old", Value::none()), "replace arg 1");
  std::string repl = require_string(arg_or(a, 1, "new", Value::none()), "replace arg 2");
  int64_t count = to_int(arg_or(a, 2, "count", Value(-1)), "count");
  auto r = py_replace(s.as_string(), old, repl, count, in.limits().max_output_bytes);
  if (!r) fail_limit("template string value exceeded max_output_bytes");
  return make_string(in, std::move(*r));
}
Value m_find(Interpreter&, const Value& s, CallArgs& a) {
  return Value(py_find(s.as_string(), require_string(arg_or(a, 0, "sub", Value::none()), "find arg"), false));
}
Value m_rfind(Interpreter&, const Value& s, CallArgs& a) {
  return Value(py_find(s.as_string(), require_string(arg_or(a, 0, "sub", Value::none()), "rfind arg"), true));
}
Value m_index(Interpreter& in, const Value& s, CallArgs& a) {
  Value r = m_find(in, s, a);
  if (r.as_int() < 0) fail("substring not found");
  return r;
}
Value m_count(Interpreter&, const Value& s, CallArgs& a) {
  return Value(py_count(s.as_string(), require_string(arg_or(a, 0, "sub", Value::none()), "count arg")));
}
Value m_join(Interpreter& in, const Value& s, CallArgs& a) {
  std::string out;
  bool first = true;
  for (const auto& v : in.iterate(arg_or(a, 0, "iterable", Value::none()))) {
    if (!v.is_string()) fail(std::string("sequence item: expected str instance, ") + v.type_name() + " found");
    if (!first) out += s.as_string();
    first = false;
    out += v.as_string();
    in.check_string_size(out.size());
  }
  return make_string(in, std::move(out));
}
Value m_removeprefix(Interpreter& in, const Value& s, CallArgs& a) {
  std::string p = require_string(arg_or(a, 0, "prefix", Value::none()), "removeprefix arg");
  const std::string& str = s.as_string();
  return make_string(in, str.compare(0, p.size(), p) == 0 ? str.substr(p.size()) : str);
}
Value m_removesuffix(Interpreter& in, const Value& s, CallArgs& a) {
  std::string p = require_string(arg_or(a, 0, "suffix", Value::none()), "removesuffix arg");
  const std::string& str = s.as_string();
  if (!p.empty() && str.size() >= p.size() && str.compare(str.size() - p.size(), p.size(), p) == 0)
    return make_string(in, str.substr(0, str.size() - p.size()));
  return s;
}
template <bool (*Pred)(uint32_t)>
Value m_is(Interpreter&, const Value& s, CallArgs&) {
  auto cps = utf8_decode(s.as_string());
  if (cps.empty()) return Value(false);
  for (uint32_t c : cps)
    if (!Pred(c)) return Value(false);
  return Value(true);
}
Value m_islower(Interpreter&, const Value& s, CallArgs&) {
  bool cased = false;
  for (uint32_t c : utf8_decode(s.as_string())) {
    if (py_is_cased_upper(c)) return Value(false);
    cased = cased || py_is_cased_lower(c);
  }
  return Value(cased);
}
Value m_isupper(Interpreter&, const Value& s, CallArgs&) {
  bool cased = false;
  for (uint32_t c : utf8_decode(s.as_string())) {
    if (py_is_cased_lower(c)) return Value(false);
    cased = cased || py_is_cased_upper(c);
  }
  return Value(cased);
}

// str.format: {} {0} {name} with an optional !r/!s conversion; format specs are not supported.
Value m_format(Interpreter& in, const Value& s, CallArgs& a) {
  const std::string& f = s.as_string();
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    char c = f[i];
    if (c == '{' && i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      size_t close = f.find('}', i);
      if (close == std::string::npos) fail("Single '{' encountered in format string");
      std::string field = f.substr(i + 1, close - i - 1);
      char conv = 's';
      size_t bang = field.find('!');
      if (bang != std::string::npos) {
        conv = bang + 1 < field.size() ? field[bang + 1] : 's';
        field = field.substr(0, bang);
      }
      if (field.find(':') != std::string::npos) fail("format specs in str.format are not supported");
      Value v;
      if (field.empty()) {
        if (auto_idx >= a.pos.size()) fail("Replacement index out of range for positional args tuple");
        v = a.pos[auto_idx++];
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        size_t idx = std::stoul(field.substr(0, 9));
        if (idx >= a.pos.size()) fail("Replacement index out of range for positional args tuple");
        v = a.pos[idx];
      } else {
        const Value* kv = a.kwarg(field);
        if (!kv) fail("KeyError: '" + field + "'");
        v = *kv;
      }
      out += conv == 'r' ? v.repr() : v.str();
      in.check_string_size(out.size());
      i = close;
    } else if (c == '}') {
      fail("Single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return make_string(in, std::move(out));
}

Value m_get(Interpreter&, const Value& d, CallArgs& a) {
  Value key = arg_or(a, 0, "key", Value::none());
  Value def = arg_or(a, 1, "default", Value::none());
  if (!key.is_string()) return def;
  const Value* v = d.as_dict().find(key.as_string());
  return v ? *v : def;
}
Value m_items(Interpreter& in, const Value& d, CallArgs&) {
  std::vector<Value> out;
  for (const auto& kv : d.as_dict().items) out.push_back(Value::list({Value(kv.first), kv.second}, true));
  in.step(static_cast<int64_t>(out.size()));
  return Value::list(std::move(out));
}
Value m_keys(Interpreter& in, const Value& d, CallArgs&) {
  std::vector<Value> out;
  for (const auto& kv : d.as_dict().items) out.emplace_back(kv.first);
  in.step(static_cast<int64_t>(out.size()));
  return Value::list(std::move(out));
}
Value m_values(Interpreter& in, const Value& d, CallArgs&) {
  std::vector<Value> out;
  for (const auto& kv : d.as_dict().items) out.push_back(kv.second);
  in.step(static_cast<int64_t>(out.size()));
  return Value::list(std::move(out));
}
Value m_copy(Interpreter&, const Value& v, CallArgs&) { return v; }
Value m_list_index(Interpreter&, const Value& l, CallArgs& a) {
  Value x = arg_or(a, 0, "value", Value::none());
  const auto& items = l.as_list().items;
  for (size_t i = 0; i < items.size(); ++i)
    if (values_equal(items[i], x)) return Value(static_cast<int64_t>(i));
  fail(x.repr() + " is not in list");
}
Value m_list_count(Interpreter&, const Value& l, CallArgs& a) {
  Value x = arg_or(a, 0, "value", Value::none());
  int64_t n = 0;
  for (const auto& v : l.as_list().items) n += values_equal(v, x);
  return Value(n);
}

struct Entry {
  const char* name;
  Method fn;
};

const Entry kStrMethods[] = {
    {"strip", m_strip},       {"lstrip", m_lstrip},         {"rstrip", m_rstrip},
    {"split", m_split},       {"rsplit", m_rsplit},         {"splitlines", m_splitlines},
    {"startswith", m_startswith}, {"endswith", m_endswith}, {"upper", m_upper},
    {"lower", m_lower},       {"title", m_title},           {"capitalize", m_capitalize},
    {"replace", m_replace},   {"find", m_find},             {"rfind", m_rfind},
    {"index", m_index},       {"count", m_count},           {"join", m_join},
    {"format", m_format},     {"removeprefix", m_removeprefix}, {"removesuffix", m_removesuffix},
    {"isdigit", m_is<py_isdigit>}, {"isalpha", m_is<py_isalpha>}, {"isalnum", m_is<py_isalnum>},
    {"isspace", m_is<py_isspace>}, {"islower", m_islower},  {"isupper", m_isupper},
};
const Entry kDictMethods[] = {
    {"get", m_get}, {"items", m_items}, {"keys", m_keys}, {"values", m_values}, {"copy", m_copy},
};
const Entry kListMethods[] = {
    {"index", m_list_index}, {"count", m_list_count}, {"copy", m_copy},
};
const char* kMutating[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
                           "update", "setdefault", "popitem", "add", "discard"};

}  // namespace

Value bound_method(Interpreter&, const Value& obj, const std::string& name) {
  const Entry* begin = nullptr;
  const Entry* end = nullptr;
  if (obj.is_string()) {
    begin = std::begin(kStrMethods);
    end = std::end(kStrMethods);
  } else if (obj.is_dict()) {
    begin = std::begin(kDictMethods);
    end = std::end(kDictMethods);
  } else if (obj.is_list()) {
    begin = std::begin(kListMethods);
    end = std::end(kListMethods);
  } else {
    return Value::undefined();
  }
  for (const Entry* e = begin; e != end; ++e) {
    if (name == e->name) {
      Method fn = e->fn;
      return Value::callable(name, [fn, obj](Interpreter& in, CallArgs& a) { return fn(in, obj, a); });
    }
  }
  if (obj.is_list() || obj.is_dict()) {
    for (const char* m : kMutating)
      if (name == m)
        return Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe.");
  }
  return Value::undefined();
}

}  // namespace osprey::jinja
