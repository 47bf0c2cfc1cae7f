#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cstring>

#include "tokenizer/jinja/value.h"

namespace osprey::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  explicit Lexer(std::string_view raw) {
    // Newlines are normalised to "\n" everywhere; one trailing newline dropped.
    src_.reserve(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\r') {
        src_ += '\n';
        if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
      } else {
        src_ += raw[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    const size_t n = src_.size();
    while (pos < n) {
      size_t tag = find_tag(pos);
      if (tag == std::string::npos) {
        emit(TokKind::kText, src_.substr(pos), pos);
        break;
      }
      char type = src_[tag + 1];  // '{', '%' or '#'
      size_t p = tag + 2;
      char sign = (p < n && (src_[p] == '-' || src_[p] == '+')) ? src_[p] : 0;
      if (sign) ++p;
      std::string text = src_.substr(pos, tag - pos);
      size_t raw_body = (type == '%') ? match_raw_begin(p) : std::string::npos;
      strip_text(text, sign, type != '{', line_starting);
      if (!text.empty()) emit(TokKind::kText, std::move(text), pos);

      if (type == '#') {
        pos = end_comment(p, tag, &line_starting);
        continue;
      }
      if (raw_body != std::string::npos) {
        pos = lex_raw(raw_body, tag, &line_starting);
        continue;
      }
      emit(type == '{' ? TokKind::kVarBegin : TokKind::kBlockBegin, type == '{' ? "{{" : "{%", tag);
      pos = lex_tag(p, type == '%', &line_starting);
    }
    Token eof;
    eof.kind = TokKind::kEof;
    set_pos(eof, src_.size());
    toks_.push_back(eof);
    return std::move(toks_);
  }

 private:
  [[noreturn]] void error(size_t offset, const std::string& msg) {
    TemplateError e(StatusCode::kInvalidArgument, msg);
    Token t;
    set_pos(t, offset);
    e.line = t.line;
    e.column = t.column;
    throw e;
  }

  void set_pos(Token& t, size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    t.line = static_cast<int>(line);
    t.column = static_cast<int>(offset - line_starts_[line - 1] + 1);
  }

  void emit(TokKind kind, std::string text, size_t offset) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    set_pos(t, offset);
    toks_.push_back(std::move(t));
  }

  size_t find_tag(size_t pos) const {
    while (true) {
      size_t i = src_.find('{', pos);
      if (i == std::string::npos || i + 1 >= src_.size()) return std::string::npos;
      char c = src_[i + 1];
      if (c == '{' || c == '%' || c == '#') return i;
      pos = i + 1;
    }
  }

  // Whitespace control for the data before a tag: "-" strips all trailing
  // whitespace; otherwise lstrip_blocks removes spaces/tabs between the line
  // start and a block or comment tag unless the tag says "+".
  static void strip_text(std::string& text, char sign, bool is_block_or_comment, bool line_starting) {
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && is_space(text[e - 1])) --e;
      text.resize(e);
    } else if (sign != '+' && is_block_or_comment) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
        bool all_ws = true;
        for (size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && is_space(text[i]);
        if (all_ws) text.resize(l_pos);
      }
    }
  }

  // Position after a block-end string starting at p ("+%}", "-%}\s*", "%}\n?"),
  // or npos if none starts there. `close` is '%' or '#'.
  size_t match_end(size_t p, char close, bool* line_starting) const {
    const size_t n = src_.size();
    auto at = [&](size_t i, char a, char b) { return i + 1 < n && src_[i] == a && src_[i + 1] == b; };
    size_t end;
    if (p < n && src_[p] == '+' && at(p + 1, close, '}')) {
      end = p + 3;
    } else if (p < n && src_[p] == '-' && at(p + 1, close, '}')) {
      end = p + 3;
      while (end < n && is_space(src_[end])) ++end;
    } else if (at(p, close, '}')) {
      end = p + 2;
      if (end < n && src_[end] == '\n') ++end;  // trim_blocks
    } else {
      return std::string::npos;
    }
    *line_starting = src_[end - 1] == '\n';
    return end;
  }

  size_t end_comment(size_t p, size_t tag, bool* line_starting) {
    for (size_t i = p; i < src_.size(); ++i) {
      size_t e = match_end(i, '#', line_starting);
      if (e != std::string::npos) return e;
    }
    error(tag, "Missing end of comment tag");
  }

  // If a raw-begin tag `{% raw %}` starts at p (after "{%" and sign), the
  // offset of the raw body; else npos.
  size_t match_raw_begin(size_t p) const {
    const size_t n = src_.size();
    while (p < n && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return std::string::npos;
    p += 3;
    if (p < n && is_name_char(src_[p])) return std::string::npos;
    while (p < n && is_space(src_[p])) ++p;
    if (p + 2 < n + 0 && src_[p] == '-' && src_.compare(p + 1, 2, "%}") == 0) {
      p += 3;
      while (p < n && is_space(src_[p])) ++p;
      return p;
    }
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string::npos;
  }

  size_t lex_raw(size_t body, size_t tag, bool* line_starting) {
    const size_t n = src_.size();
    for (size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t p = i + 2;
      char sign = (p < n && (src_[p] == '-' || src_[p] == '+')) ? src_[p] : 0;
      if (sign) ++p;
      while (p < n && is_space(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p += 6;
      while (p < n && is_space(src_[p])) ++p;
      bool ls = false;
      size_t e = match_end(p, '%', &ls);
      if (e == std::string::npos) continue;
      std::string text = src_.substr(body, i - body);
      strip_text(text, sign, true, *line_starting);
      if (!text.empty()) emit(TokKind::kText, std::move(text), body);
      *line_starting = ls;
      return e;
    }
    error(tag, "Missing end of raw directive");
  }

  size_t lex_tag(size_t p, bool is_block, bool* line_starting) {
    const size_t n = src_.size();
    std::vector<char> brackets;
    while (true) {
      while (p < n && is_space(src_[p])) ++p;
      if (p >= n) error(p, is_block ? "unexpected end of template, expected 'end of statement block'"
                                    : "unexpected end of template, expected 'end of print statement'");
      if (brackets.empty()) {
        if (is_block) {
          size_t e = match_end(p, '%', line_starting);
          if (e != std::string::npos) {
            emit(TokKind::kBlockEnd, "%}", p);
            return e;
          }
        } else {
          bool dash = src_[p] == '-' && src_.compare(p + 1, 2, "}}") == 0;
          if (dash || src_.compare(p, 2, "}}") == 0) {
            emit(TokKind::kVarEnd, "}}", p);
            size_t e = p + (dash ? 3 : 2);
            if (dash)
              while (e < n && is_space(src_[e])) ++e;
            *line_starting = src_[e - 1] == '\n';
            return e;
          }
        }
      }
      char c = src_[p];
      if (is_digit(c)) {
        p = lex_number(p);
      } else if (is_name_start(c)) {
        size_t s = p;
        while (p < n && is_name_char(src_[p])) ++p;
        emit(TokKind::kName, src_.substr(s, p - s), s);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* o : kOps2)
          if (src_.compare(p, 2, o) == 0) op = o;
        if (op.empty()) {
          if (!std::strchr("+-/*%~[](){}<>=.:|,;", c)) error(p, std::string("unexpected char '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") {
          brackets.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (brackets.empty()) error(p, "unexpected '" + op + "'");
          if (brackets.back() != op[0])
            error(p, "unexpected '" + op + "', expected '" + std::string(1, brackets.back()) + "'");
          brackets.pop_back();
        }
        emit(TokKind::kOp, op, p);
        p += op.size();
      }
    }
  }

  size_t lex_number(size_t p) {
    const size_t n = src_.size();
    size_t s = p;
    auto digits = [&] {
      while (p < n && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < n && is_digit(src_[p + 1])))) ++p;
    };
    digits();
    bool is_float = false;
    if (p + 1 < n && src_[p] == '.' && is_digit(src_[p + 1])) {
      is_float = true;
      ++p;
      digits();
    }
    if (p < n && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < n && is_digit(src_[q])) {
        is_float = true;
        p = q;
        digits();
      }
    }
    std::string text;
    for (size_t i = s; i < p; ++i)
      if (src_[i] != '_') text += src_[i];
    emit(is_float ? TokKind::kFloat : TokKind::kInt, text, s);
    return p;
  }

  // String literal with Python-style escapes (jinja decodes with unicode-escape).
  size_t lex_string(size_t p) {
    const size_t n = src_.size();
    char q = src_[p];
    size_t s = p++;
    std::string out;
    while (true) {
      if (p >= n) error(s, "unexpected end of string");
      char c = src_[p];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= n) error(s, "unexpected end of string");
      char e = src_[p + 1];
      p += 2;
      auto hex = [&](int count) -> uint32_t {
        uint32_t v = 0;
        for (int k = 0; k < count; ++k, ++p) {
          if (p >= n || !std::isxdigit(static_cast<unsigned char>(src_[p]))) error(s, "truncated \\x/\\u escape in string");
          char h = src_[p];
          v = v * 16 + static_cast<uint32_t>(is_digit(h) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'a': out += '\a'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;  // line continuation
        case 'x': utf8_append(out, hex(2)); break;
        case 'u': {
          uint32_t cp = hex(4);
          if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;  // lone surrogate: not representable in UTF-8
          utf8_append(out, cp);
          break;
        }
        case 'U': {
          uint32_t cp = hex(8);
          if (cp > 0x10FFFF) error(s, "illegal Unicode character in string");
          if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
          utf8_append(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && p < n && src_[p] >= '0' && src_[p] <= '7'; ++k, ++p)
              v = v * 8 + static_cast<uint32_t>(src_[p] - '0');
            utf8_append(out, v);
          } else {  // unknown escape: kept literally, as Python does
            out += '\\';
            out += e;
          }
      }
    }
    emit(TokKind::kString, std::move(out), s);
    return p + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> toks_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace osprey::jinja
