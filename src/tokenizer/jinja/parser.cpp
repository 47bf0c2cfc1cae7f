#include "tokenizer/jinja/parser.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "tokenizer/jinja/lexer.h"

namespace osprey::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : toks_(std::move(toks)) {}

  Body parse_all() {
    Body body = parse_body({});
    return body;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxParseDepth) p_->error("template nesting too deep");
    }
    ~DepthGuard() { --p_->depth_; }
    Parser* p_;
  };

  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  Token next() {
    Token t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }

  [[noreturn]] void error_at(const Token& t, const std::string& msg) {
    TemplateError e(StatusCode::kInvalidArgument, msg);
    e.line = t.line;
    e.column = t.column;
    throw e;
  }
  [[noreturn]] void error(const std::string& msg) { error_at(cur(), msg); }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokKind::kEof: return "end of template";
      case TokKind::kBlockEnd: return "end of statement block";
      case TokKind::kVarEnd: return "end of print statement";
      case TokKind::kText: return "template data";
      case TokKind::kString: return "string";
      case TokKind::kInt: return "integer";
      case TokKind::kFloat: return "float";
      default: return "'" + t.text + "'";
    }
  }

  bool is_op(const char* op) const { return cur().kind == TokKind::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == TokKind::kName && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) error(std::string("expected '") + op + "', got " + describe(cur()));
    next();
  }
  void expect_block_end() {
    if (cur().kind != TokKind::kBlockEnd) error("expected 'end of statement block', got " + describe(cur()));
    next();
  }
  std::string expect_name() {
    if (cur().kind != TokKind::kName) error("expected name, got " + describe(cur()));
    return next().text;
  }

  ExprPtr make(ExprKind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  StmtPtr make_stmt(StmtKind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->column = at.column;
    return s;
  }

  // Parses statements until a block tag whose name is in `end_tags`; leaves
  // the stream on that name token. At the top level end_tags is empty.
  Body parse_body(std::initializer_list<const char*> end_tags) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TokKind::kEof) {
        if (end_tags.size() == 0) return body;
        std::string want;
        for (const char* e : end_tags) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
        error("Unexpected end of template. Jinja was looking for the following tags: " + want + ".");
      }
      if (t.kind == TokKind::kText) {
        auto s = make_stmt(StmtKind::kText, t);
        s->text = next().text;
        body.push_back(std::move(s));
      } else if (t.kind == TokKind::kVarBegin) {
        Token begin = next();
        auto s = make_stmt(StmtKind::kPrint, begin);
        s->expr = parse_tuple(true);
        if (cur().kind != TokKind::kVarEnd) error("expected 'end of print statement', got " + describe(cur()));
        next();
        body.push_back(std::move(s));
      } else if (t.kind == TokKind::kBlockBegin) {
        next();
        if (cur().kind != TokKind::kName) error("tag name expected");
        for (const char* e : end_tags)
          if (cur().text == e) return body;
        body.push_back(parse_statement());
      } else {
        error("unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    const Token tag = cur();
    const std::string& n = tag.text;
    if (n == "for") return parse_for();
    if (n == "if") return parse_if();
    if (n == "set") return parse_set();
    if (n == "macro") return parse_macro();
    if (n == "call") return parse_call_block();
    if (n == "filter") return parse_filter_block();
    if (n == "break" || n == "continue") {
      next();
      if (loop_depth_ == 0) error_at(tag, "'" + n + "' outside of a loop");
      expect_block_end();
      return make_stmt(n == "break" ? StmtKind::kBreak : StmtKind::kContinue, tag);
    }
    if (n == "generation") {
      next();
      expect_block_end();
      auto s = make_stmt(StmtKind::kScope, tag);
      s->body = parse_body({"endgeneration"});
      end_tag();
      return s;
    }
    static const char* kKnownEnds[] = {"endfor", "endif", "else", "elif", "endset", "endmacro", "endcall",
                                       "endfilter", "endgeneration", "endraw"};
    for (const char* e : kKnownEnds)
      if (n == e) error("Encountered unknown tag '" + n + "'. Jinja was not expecting this tag here.");
    error("Encountered unknown tag '" + n + "'.");
  }

  // Consumes the end tag name the body stopped on and the block end.
  void end_tag() {
    next();
    expect_block_end();
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = is_op("(");
    if (paren) next();
    names.push_back(expect_name());
    while (is_op(",")) {
      next();
      if (cur().kind != TokKind::kName || is_name("in")) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for() {
    auto s = make_stmt(StmtKind::kFor, next());
    s->targets = parse_targets();
    if (!is_name("in")) error("expected 'in', got " + describe(cur()));
    next();
    s->expr = parse_tuple(false);
    if (is_name("if")) {
      next();
      s->cond = parse_expression(true);
    }
    if (is_name("recursive")) error("recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    s->body = parse_body({"endfor", "else"});
    --loop_depth_;
    if (cur().text == "else") {
      end_tag();
      s->else_body = parse_body({"endfor"});
    }
    end_tag();
    return s;
  }

  StmtPtr parse_if() {
    auto s = make_stmt(StmtKind::kIf, next());
    s->expr = parse_tuple(false);
    expect_block_end();
    s->body = parse_body({"elif", "else", "endif"});
    if (cur().text == "elif") {
      s->else_body.push_back(parse_if());  // consumes through endif
      return s;
    }
    if (cur().text == "else") {
      end_tag();
      s->else_body = parse_body({"endif"});
    }
    end_tag();
    return s;
  }

  StmtPtr parse_set() {
    auto s = make_stmt(StmtKind::kSet, next());
    if (cur().kind == TokKind::kName && peek().kind == TokKind::kOp && peek().text == ".") {
      s->targets.push_back(next().text);
      next();
      s->attr = expect_name();
    } else {
      s->targets = parse_targets();
    }
    if (is_op("=")) {
      next();
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    if (!s->attr.empty() || s->targets.size() != 1) error("expected '='");
    s->kind = StmtKind::kSetBlock;
    while (is_op("|")) s->filters.push_back(parse_filter(nullptr));
    expect_block_end();
    s->body = parse_body({"endset"});
    end_tag();
    return s;
  }

  void parse_signature(Stmt* s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s->targets.empty()) expect_op(",");
      if (is_op(")")) break;
      s->targets.push_back(expect_name());
      if (is_op("=")) {
        next();
        s->defaults.push_back(parse_expression(true));
      } else {
        s->defaults.push_back(nullptr);
      }
    }
    next();
  }

  StmtPtr parse_macro() {
    auto s = make_stmt(StmtKind::kMacro, next());
    s->text = expect_name();
    parse_signature(s.get());
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"});
    loop_depth_ = saved;
    end_tag();
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = make_stmt(StmtKind::kCallBlock, next());
    if (is_op("(")) parse_signature(s.get());
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::kCall) error_at(*toks_.data(), "expected call");
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endcall"});
    loop_depth_ = saved;
    end_tag();
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = make_stmt(StmtKind::kFilterBlock, next());
    s->filters.push_back(parse_filter(nullptr, /*leading_pipe=*/false));
    while (is_op("|")) s->filters.push_back(parse_filter(nullptr));
    expect_block_end();
    s->body = parse_body({"endfilter"});
    end_tag();
    return s;
  }

  // ---- expressions ----
  bool is_tuple_end() const {
    const Token& t = cur();
    if (t.kind == TokKind::kBlockEnd || t.kind == TokKind::kVarEnd || t.kind == TokKind::kEof) return true;
    if (t.kind == TokKind::kOp && (t.text == ")" || t.text == "]" || t.text == "}")) return true;
    return t.kind == TokKind::kName && (t.text == "if" || t.text == "recursive");
  }

  ExprPtr parse_tuple(bool with_condexpr) {
    const Token start = cur();
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto tup = make(ExprKind::kTuple, start);
    tup->children.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (is_tuple_end()) break;
      tup->children.push_back(parse_expression(with_condexpr));
    }
    return tup;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    const Token start = cur();
    ExprPtr expr1 = parse_or();
    while (is_name("if")) {
      next();
      auto c = make(ExprKind::kCondExpr, start);
      c->children.push_back(parse_or());
      c->children.push_back(std::move(expr1));
      if (is_name("else")) {
        next();
        c->children.push_back(parse_condexpr());
      } else {
        c->children.push_back(nullptr);
      }
      expr1 = std::move(c);
    }
    return expr1;
  }

  ExprPtr binary(ExprKind kind, const Token& at, ExprPtr l, ExprPtr r, std::string op = {}) {
    auto e = make(kind, at);
    e->name = std::move(op);
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      Token t = next();
      left = binary(ExprKind::kOr, t, std::move(left), parse_and());
    }
    return left;
  }
  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      Token t = next();
      left = binary(ExprKind::kAnd, t, std::move(left), parse_not());
    }
    return left;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(this);
      auto e = make(ExprKind::kNot, next());
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const Token start = cur();
    ExprPtr expr = parse_math1();
    std::unique_ptr<Expr> cmp;
    while (true) {
      std::string op;
      const Token& t = cur();
      if (t.kind == TokKind::kOp &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().kind == TokKind::kName && peek().text == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::kCompare, start);
        cmp->children.push_back(std::move(expr));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(expr);
  }
  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      Token t = next();
      left = binary(ExprKind::kBinary, t, std::move(left), parse_concat(), t.text);
    }
    return left;
  }
  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      Token t = next();
      left = binary(ExprKind::kBinary, t, std::move(left), parse_math2(), "~");
    }
    return left;
  }
  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      Token t = next();
      left = binary(ExprKind::kBinary, t, std::move(left), parse_pow(), t.text);
    }
    return left;
  }
  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      Token t = next();
      left = binary(ExprKind::kBinary, t, std::move(left), parse_unary(true), "**");
    }
    return left;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      Token t = next();
      node = make(t.text == "-" ? ExprKind::kNeg : ExprKind::kPos, t);
      node->children.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token t = cur();
    if (t.kind == TokKind::kName) {
      next();
      auto e = make(ExprKind::kConst, t);
      if (t.text == "true" || t.text == "True") e->value = Value(true);
      else if (t.text == "false" || t.text == "False") e->value = Value(false);
      else if (t.text == "none" || t.text == "None") e->value = Value::none();
      else {
        e->kind = ExprKind::kName;
        e->name = t.text;
      }
      return e;
    }
    if (t.kind == TokKind::kString) {
      std::string s;
      while (cur().kind == TokKind::kString) s += next().text;
      auto e = make(ExprKind::kConst, t);
      e->value = Value(std::move(s));
      return e;
    }
    if (t.kind == TokKind::kInt || t.kind == TokKind::kFloat) {
      next();
      auto e = make(ExprKind::kConst, t);
      if (t.kind == TokKind::kInt) {
        int64_t v = 0;
        auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc() || r.ptr != t.text.data() + t.text.size()) error_at(t, "integer literal too large");
        e->value = Value(v);
      } else {
        e->value = Value(std::strtod(t.text.c_str(), nullptr));
      }
      return e;
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        auto e = make(ExprKind::kTuple, t);
        return e;
      }
      ExprPtr inner = parse_expression(true);
      if (is_op(",")) {
        auto tup = make(ExprKind::kTuple, t);
        tup->children.push_back(std::move(inner));
        while (is_op(",")) {
          next();
          if (is_op(")")) break;
          tup->children.push_back(parse_expression(true));
        }
        inner = std::move(tup);
      }
      expect_op(")");
      return inner;
    }
    if (is_op("[")) {
      next();
      auto e = make(ExprKind::kList, t);
      while (!is_op("]")) {
        if (!e->children.empty()) expect_op(",");
        if (is_op("]")) break;
        e->children.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = make(ExprKind::kDict, t);
      while (!is_op("}")) {
        if (!e->children.empty()) expect_op(",");
        if (is_op("}")) break;
        e->children.push_back(parse_expression(true));
        expect_op(":");
        e->children.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    error("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        Token t = next();
        if (cur().kind == TokKind::kName) {
          auto e = make(ExprKind::kGetAttr, t);
          e->name = next().text;
          e->children.push_back(std::move(node));
          node = std::move(e);
        } else if (cur().kind == TokKind::kInt) {
          auto e = make(ExprKind::kGetItem, t);
          e->children.push_back(std::move(node));
          e->children.push_back(parse_primary());
          node = std::move(e);
        } else {
          error("expected name or number");
        }
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    DepthGuard guard(this);
    Token t = next();  // '['
    ExprPtr parts[3];
    bool is_slice = false;
    int idx = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        next();
        is_slice = true;
        if (++idx > 2) error("invalid slice");
        continue;
      }
      if (parts[idx]) error("expected ']'");
      parts[idx] = parse_expression(true);
      if (!is_slice && is_op(",")) error("tuple subscripts are not supported");
    }
    next();
    if (!is_slice) {
      if (!parts[0]) error_at(t, "expected subscript expression");
      auto e = make(ExprKind::kGetItem, t);
      e->children.push_back(std::move(node));
      e->children.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make(ExprKind::kSlice, t);
    e->children.push_back(std::move(node));
    for (auto& p : parts) e->children.push_back(std::move(p));
    return e;
  }

  // Appends positional then keyword args of a "(...)" list to e.
  void parse_args(Expr* e) {
    expect_op("(");
    std::vector<ExprPtr> pos, kw;
    while (!is_op(")")) {
      if (!pos.empty() || !kw.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) error("*args and **kwargs in calls are not supported");
      if (cur().kind == TokKind::kName && peek().kind == TokKind::kOp && peek().text == "=") {
        e->kw_names.push_back(next().text);
        next();
        kw.push_back(parse_expression(true));
      } else {
        if (!kw.empty()) error("positional argument follows keyword argument");
        pos.push_back(parse_expression(true));
      }
    }
    next();
    for (auto& p : pos) e->children.push_back(std::move(p));
    for (auto& k : kw) e->children.push_back(std::move(k));
  }

  ExprPtr parse_call(ExprPtr node) {
    DepthGuard guard(this);
    auto e = make(ExprKind::kCall, cur());
    e->children.push_back(std::move(node));
    parse_args(e.get());
    return e;
  }

  ExprPtr parse_filter(ExprPtr operand, bool leading_pipe = true) {
    DepthGuard guard(this);
    if (leading_pipe) expect_op("|");
    auto e = make(ExprKind::kFilter, cur());
    e->name = expect_name();
    while (is_op(".")) {
      next();
      e->name += "." + expect_name();
    }
    e->children.push_back(std::move(operand));
    if (is_op("(")) parse_args(e.get());
    return e;
  }

  ExprPtr parse_test(ExprPtr operand) {
    DepthGuard guard(this);
    next();  // 'is'
    auto e = make(ExprKind::kTest, cur());
    if (is_name("not")) {
      next();
      e->negated = true;
    }
    e->name = expect_name();
    while (is_op(".")) {
      next();
      e->name += "." + expect_name();
    }
    e->children.push_back(std::move(operand));
    const Token& t = cur();
    if (is_op("(")) {
      parse_args(e.get());
    } else if ((t.kind == TokKind::kName || t.kind == TokKind::kString || t.kind == TokKind::kInt ||
                t.kind == TokKind::kFloat || is_op("[") || is_op("{")) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) error("You cannot chain multiple tests with is");
      e->children.push_back(parse_postfix(parse_primary()));
    }
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) node = parse_filter(std::move(node));
      else if (is_name("is")) node = parse_test(std::move(node));
      else if (is_op("(")) node = parse_call(std::move(node));
      else return node;
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

std::unique_ptr<Template> parse_template(std::string_view source) {
  auto t = std::make_unique<Template>();
  t->source = std::string(source);
  Parser p(tokenize(source));
  t->body = p.parse_all();
  return t;
}

}  // namespace osprey::jinja
