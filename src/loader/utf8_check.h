// Strict UTF-8 validation for strings read from untrusted files.
#pragma once

#include <string_view>

namespace osprey {

// True when s is well-formed UTF-8: no overlong forms, no surrogates
// (U+D800..U+DFFF), nothing above U+10FFFF, no truncated sequences.
bool is_valid_utf8(std::string_view s);

}  // namespace osprey
