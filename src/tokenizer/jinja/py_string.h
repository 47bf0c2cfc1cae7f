// Python str operations over UTF-8 strings (code point semantics), shared by
// the filters and the str methods.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::jinja {

bool py_isspace(uint32_t cp);  // str.isspace for one code point
// str.strip/lstrip/rstrip; chars == nullopt strips whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split / str.rsplit; sep == nullopt splits on whitespace runs.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                                  bool from_right);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_capitalize(std::string_view s);
std::string py_title(std::string_view s);  // str.title
// str.replace; count < 0 replaces all. Returns nullopt if the result would pass max_bytes.
std::optional<std::string> py_replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count,
                                      size_t max_bytes);
// str.find in code points (-1 if absent); start/end in code points.
int64_t py_find(std::string_view s, std::string_view sub, bool from_right);
int64_t py_count(std::string_view s, std::string_view sub);
bool py_is_cased_upper(uint32_t cp);
bool py_is_cased_lower(uint32_t cp);
bool py_isalpha(uint32_t cp);
bool py_isdigit(uint32_t cp);
bool py_isalnum(uint32_t cp);

}  // namespace osprey::jinja
