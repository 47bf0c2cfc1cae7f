// UTF-8 and Unicode helpers shared by the tokenizer stages.
//
// All strings are UTF-8. Functions taking text that may be malformed say so;
// the others require valid UTF-8 (Tokenizer::encode sanitises its input first).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace osprey::tok {

// Decodes one code point at s[i]; advances i by its length. Malformed input
// yields U+FFFD and advances by the length of the maximal invalid subpart
// (Unicode §3.9 "best practice", as Python and Rust's lossy decoders do).
char32_t next_code_point(std::string_view s, size_t& i);
// Byte length of the UTF-8 sequence starting with lead byte b (1 for stray bytes).
inline size_t utf8_len(uint8_t b) {
  return b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
}
void append_utf8(std::string& out, char32_t cp);
// Copy of s with every malformed sequence replaced by U+FFFD.
std::string sanitize_utf8(std::string_view s);
bool is_valid_utf8(std::string_view s);

// Unicode properties as Rust's char methods define them (tokenizers uses these).
bool is_whitespace(char32_t c);   // White_Space
bool is_alphanumeric(char32_t c); // Alphabetic or Numeric (L*, Nl, Nd, No, Other_Alphabetic approximated by Mn/Mc)
bool is_numeric(char32_t c);      // Nd, Nl, No

// Normalisation forms; s must be valid UTF-8.
std::string nfc(std::string_view s);
std::string nfkc(std::string_view s);
std::string nfd(std::string_view s);
std::string nfkd(std::string_view s);
std::string to_lower(std::string_view s);

// GPT-2's byte-to-character table: byte b is spelled as the code point
// byte_to_unicode()[b] in byte-level vocabularies.
const std::array<char32_t, 256>& byte_to_unicode();
// Inverse of byte_to_unicode: -1 for code points outside the byte alphabet.
int unicode_to_byte(char32_t c);
// Spells raw bytes in the byte alphabet.
std::string bytes_to_byte_level(std::string_view bytes);
// Decodes a byte-level spelling back to bytes; false when a character is
// outside the byte alphabet (out is then unspecified).
bool byte_level_to_bytes(std::string_view spelled, std::string& out);

}  // namespace osprey::tok
