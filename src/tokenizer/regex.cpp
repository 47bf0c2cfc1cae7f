#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

namespace osprey::tok {

namespace {

// Per-thread scratch for matching; grows on demand, freed at thread exit.
struct MatchScratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchScratch() {
    md = pcre2_match_data_create(1, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(mctx);
    pcre2_match_data_free(md);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

Expected<std::unique_ptr<Regex>> Regex::compile(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return invalid_argument("regex '" + std::string(pattern) + "' does not compile at offset " +
                            std::to_string(err_off) + ": " + reinterpret_cast<char*>(buf));
  }
  std::unique_ptr<Regex> r(new Regex());
  r->code_ = code;
  r->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

Expected<std::unique_ptr<Regex>> Regex::literal(std::string_view text) {
  std::string quoted = "\\Q";
  // \E inside the literal would end quoting early; split around it.
  size_t pos = 0;
  while (true) {
    size_t e = text.find("\\E", pos);
    if (e == std::string_view::npos) {
      quoted.append(text.substr(pos));
      break;
    }
    quoted.append(text.substr(pos, e - pos));
    quoted += "\\E\\\\E\\Q";
    pos = e + 2;
  }
  quoted += "\\E";
  return compile(quoted);
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchScratch& s = scratch();
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), pos, 0, s.md, s.mctx)
                  : pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, s.md, s.mctx);
    if (rc < 0) break;  // no match (or resource limit: the rest stays unsplit)
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
    size_t start = ov[0], end = ov[1];
    if (end > start) {
      out.emplace_back(start, end);
      pos = end;
    } else {
      // Empty match: step over one character.
      if (start >= text.size()) break;
      pos = start + 1;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

}  // namespace osprey::tok
