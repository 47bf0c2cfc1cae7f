#include "tokenizer/jinja/py_string.h"

#include <utf8proc.h>

#include "tokenizer/jinja/value.h"

namespace osprey::jinja {

bool py_isspace(uint32_t cp) {
  switch (cp) {
    case ' ': case '\t': case '\n': case '\v': case '\f': case '\r':
    case 0x1c: case 0x1d: case 0x1e: case 0x1f: case 0x85: case 0xa0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202f: case 0x205f: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200a;
  }
}

namespace {
utf8proc_category_t category(uint32_t cp) {
  if (cp & 0x80000000u) return UTF8PROC_CATEGORY_CN;
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}
uint32_t upper_cp(uint32_t cp) {
  if (cp & 0x80000000u) return cp;
  return static_cast<uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp)));
}
uint32_t lower_cp(uint32_t cp) {
  if (cp & 0x80000000u) return cp;
  return static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
}
uint32_t title_cp(uint32_t cp) {
  if (cp & 0x80000000u) return cp;
  return static_cast<uint32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cp)));
}
bool is_cased(uint32_t cp) {
  auto c = category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}
std::string encode(const std::vector<uint32_t>& cps, size_t b, size_t e) {
  std::string out;
  for (size_t i = b; i < e; ++i) utf8_append(out, cps[i]);
  return out;
}
}  // namespace

bool py_is_cased_upper(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_LU || category(cp) == UTF8PROC_CATEGORY_LT; }
bool py_is_cased_lower(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_LL; }
bool py_isalpha(uint32_t cp) {
  auto c = category(cp);
  return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}
bool py_isdigit(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_ND; }
bool py_isalnum(uint32_t cp) {
  auto c = category(cp);
  return py_isalpha(cp) || c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<uint32_t> cps = utf8_decode(s);
  std::vector<uint32_t> set;
  if (chars) set = utf8_decode(*chars);
  auto strip_me = [&](uint32_t cp) {
    if (!chars) return py_isspace(cp);
    for (uint32_t c : set)
      if (c == cp) return true;
    return false;
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_me(cps[b])) ++b;
  if (right)
    while (e > b && strip_me(cps[e - 1])) --e;
  return encode(cps, b, e);
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                                  bool from_right) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("empty separator");
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
        size_t f = s.find(*sep, pos);
        if (f == std::string_view::npos) break;
        out.emplace_back(s.substr(pos, f - pos));
        pos = f + sep->size();
      }
      out.emplace_back(s.substr(pos));
    } else {
      size_t end = s.size();
      std::vector<std::string> rev;
      while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
        if (end < sep->size()) break;
        size_t f = s.rfind(*sep, end - sep->size());
        if (f == std::string_view::npos) break;
        rev.emplace_back(s.substr(f + sep->size(), end - f - sep->size()));
        end = f;
      }
      rev.emplace_back(s.substr(0, end));
      out.assign(rev.rbegin(), rev.rend());
    }
    return out;
  }
  std::vector<uint32_t> cps = utf8_decode(s);
  const size_t n = cps.size();
  if (!from_right) {
    size_t i = 0;
    while (true) {
      while (i < n && py_isspace(cps[i])) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = n;
        while (e > i && py_isspace(cps[e - 1])) --e;
        out.push_back(encode(cps, i, e));
        break;
      }
      size_t j = i;
      while (j < n && !py_isspace(cps[j])) ++j;
      out.push_back(encode(cps, i, j));
      i = j;
    }
  } else {
    size_t e = n;
    std::vector<std::string> rev;
    while (true) {
      while (e > 0 && py_isspace(cps[e - 1])) --e;
      if (e == 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(rev.size()) == maxsplit) {
        size_t b = 0;
        while (b < e && py_isspace(cps[b])) ++b;
        rev.push_back(encode(cps, b, e));
        break;
      }
      size_t j = e;
      while (j > 0 && !py_isspace(cps[j - 1])) --j;
      rev.push_back(encode(cps, j, e));
      e = j;
    }
    out.assign(rev.rbegin(), rev.rend());
  }
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::vector<uint32_t> cps = utf8_decode(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  const size_t n = cps.size();
  while (i < n) {
    uint32_t c = cps[i];
    bool brk = c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      ++i;
      continue;
    }
    size_t eol = i + 1;
    if (c == '\r' && i + 1 < n && cps[i + 1] == '\n') eol = i + 2;
    out.push_back(encode(cps, start, keepends ? eol : i));
    start = i = eol;
  }
  if (start < n) out.push_back(encode(cps, start, n));
  return out;
}

std::string py_upper(std::string_view s) {
  std::string out;
  for (uint32_t cp : utf8_decode(s)) {
    if (cp == 0xDF) out += "SS";  // the one full case mapping templates are likely to meet
    else utf8_append(out, upper_cp(cp));
  }
  return out;
}

std::string py_lower(std::string_view s) {
  std::string out;
  for (uint32_t cp : utf8_decode(s)) utf8_append(out, lower_cp(cp));
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::vector<uint32_t> cps = utf8_decode(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) utf8_append(out, i == 0 ? title_cp(cps[i]) : lower_cp(cps[i]));
  return out;
}

std::string py_title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (uint32_t cp : utf8_decode(s)) {
    bool cased = is_cased(cp);
    utf8_append(out, cased ? (prev_cased ? lower_cp(cp) : title_cp(cp)) : cp);
    prev_cased = cased;
  }
  return out;
}

std::optional<std::string> py_replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count,
                                      size_t max_bytes) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    std::vector<uint32_t> cps = utf8_decode(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < cps.size()) utf8_append(out, cps[i]);
      if (out.size() > max_bytes) return std::nullopt;
    }
    return out;
  }
  size_t pos = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(old, pos);
    if (f == std::string_view::npos) break;
    out.append(s.substr(pos, f - pos));
    out.append(repl);
    if (out.size() > max_bytes) return std::nullopt;
    pos = f + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  if (out.size() > max_bytes) return std::nullopt;
  return out;
}

int64_t py_find(std::string_view s, std::string_view sub, bool from_right) {
  size_t f = from_right ? s.rfind(sub) : s.find(sub);
  if (f == std::string_view::npos) return -1;
  return static_cast<int64_t>(utf8_length(s.substr(0, f)));
}

int64_t py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(utf8_length(s)) + 1;
  int64_t n = 0;
  for (size_t f = s.find(sub); f != std::string_view::npos; f = s.find(sub, f + sub.size())) ++n;
  return n;
}

}  // namespace osprey::jinja
