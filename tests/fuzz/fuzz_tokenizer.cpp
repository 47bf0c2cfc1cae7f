// libFuzzer target for the tokenizer.
//
// The first input byte picks the mode:
//   even: the rest is a tokenizer.json candidate (no config) -> from_json must
//         return an error or a tokenizer that encodes/decodes without crashing;
//   odd:  the rest is text for a small real tokenizer (a byte-level BPE with
//         added tokens, built once): encode with and without special tokens,
//         decode, stream-decode, and check that byte-level decode round-trips
//         valid UTF-8 input exactly.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_text.h"

namespace {

// A byte-level BPE over all 256 byte tokens, a few merges and special tokens.
std::string small_tokenizer_json() {
  std::string vocab;
  const auto& table = osprey::tok::byte_to_unicode();
  int id = 0;
  auto add = [&](const std::string& spelled) {
    std::string esc;
    for (char c : spelled) {
      if (c == '"' || c == '\\') esc += '\\';
      esc += c;
    }
    vocab += (id ? "," : "") + std::string("\"") + esc + "\":" + std::to_string(id);
    ++id;
  };
  for (int b = 0; b < 256; ++b) {
    std::string s;
    osprey::tok::append_utf8(s, table[b]);
    add(s);
  }
  for (const char* t : {"he", "ll", "hell", "hello", "\xC4\xA0t", "\xC4\xA0th", "\xC4\xA0the"}) add(t);
  return R"({"version":"1.0","added_tokens":[
      {"id":300,"content":"<|im_start|>","special":true,"normalized":false,"lstrip":false,"rstrip":false,"single_word":false},
      {"id":301,"content":"<|im_end|>","special":true,"normalized":false,"lstrip":true,"rstrip":true,"single_word":false},
      {"id":302,"content":"word","special":false,"normalized":true,"lstrip":false,"rstrip":false,"single_word":true}],
    "normalizer":{"type":"NFC"},
    "pre_tokenizer":{"type":"Sequence","pretokenizers":[
      {"type":"Split","pattern":{"Regex":"(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},
      {"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]},
    "post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|im_start|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
      "pair":[],"special_tokens":{"<|im_start|>":{"id":"<|im_start|>","ids":[300],"tokens":["<|im_start|>"]}}},
    "decoder":{"type":"ByteLevel"},
    "model":{"type":"BPE","dropout":null,"unk_token":null,"byte_fallback":false,"fuse_unk":false,"ignore_merges":true,
      "vocab":{)" + vocab + R"(},
      "merges":["h e","l l","he ll","hell o","\u0120 t","\u0120t h","\u0120th e"]}})";
}

const osprey::Tokenizer& small_tokenizer() {
  static const std::unique_ptr<osprey::Tokenizer> tok = [] {
    auto t = osprey::Tokenizer::from_json(small_tokenizer_json(), "");
    if (!t.ok()) std::abort();
    return std::move(t).value();
  }();
  return *tok;
}

void exercise(const osprey::Tokenizer& tok, std::string_view text) {
  for (bool special : {false, true}) {
    auto ids = tok.encode(text, special);
    std::string full = tok.decode(ids, false);
    (void)tok.decode(ids, true);
    osprey::IncrementalDetokenizer d(tok, false);
    std::string streamed;
    for (int32_t id : ids) streamed += d.step(id);
    streamed += d.finish();
    if (streamed != full) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    auto t = osprey::Tokenizer::from_json(rest, "");
    if (t.ok()) exercise(**t, "Hello world <|im_start|> 123 \xC3\xA9");
    return 0;
  }
  const osprey::Tokenizer& tok = small_tokenizer();
  exercise(tok, rest);
  // Byte-level BPE loses nothing: valid UTF-8 without special spellings round-trips.
  if (osprey::tok::is_valid_utf8(rest) && rest.find("<|im_") == std::string_view::npos &&
      rest.find("word") == std::string_view::npos) {
    std::string nfc = osprey::tok::nfc(rest);
    if (tok.decode(tok.encode(rest, false)) != nfc) std::abort();
  }
  return 0;
}
