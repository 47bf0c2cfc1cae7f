// Interpreter: renders a parsed Template against a context, under limits.
// One Interpreter serves one render; it is not shared between threads.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace osprey::jinja {

class Interpreter {
 public:
  explicit Interpreter(const TemplateLimits& limits);

  // Template variables (context keys and globals) live in the outermost frame.
  void set_global(const std::string& name, Value v);
  // Throws TemplateError; the caller converts it to a Status.
  std::string render(const Template& t);

  // ---- for builtins ----
  // Charges n evaluation steps; throws once max_steps is exceeded.
  void step(int64_t n = 1);
  // Throws if a string of `bytes` or a list of `items` would pass the limits.
  void check_string_size(size_t bytes) const;
  void check_list_size(size_t items) const;
  void count_iteration();
  Value call(const Value& fn, CallArgs& args);
  // Jinja getattr (attribute, then item) and getitem (item, then attribute).
  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);
  // Items iterated by `for`: list items, dict keys, string characters.
  std::vector<Value> iterate(const Value& v);
  Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
  bool apply_test(const std::string& name, const Value& input, CallArgs& args);
  const TemplateLimits& limits() const { return limits_; }

 private:
  using Frame = std::unordered_map<std::string, Value>;
  using Scope = std::vector<std::shared_ptr<Frame>>;
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec_body(const Body& body, std::string& out);
  Flow exec(const Stmt& s, std::string& out);
  void exec_for(const Stmt& s, std::string& out);
  void exec_set(const Stmt& s);
  Value make_macro(const Stmt& s, const Stmt* caller_of = nullptr);
  Value eval(const Expr& e);
  Value eval_binary(const Expr& e);
  Value eval_compare(const Expr& e);
  Value eval_call(const Expr& e);
  void eval_args(const Expr& e, size_t first, CallArgs& args);
  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);
  void append(std::string& out, std::string_view s) const;
  void at(int line, int column) {
    line_ = line;
    column_ = column;
  }

  TemplateLimits limits_;
  Scope scope_;
  int64_t steps_ = 0;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
  int line_ = 0;
  int column_ = 0;
};

// Builtins (builtins.cpp / string_methods.cpp).
using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// A bound method of a str/list/dict (e.g. "abc".upper), or undefined.
Value bound_method(Interpreter& in, const Value& obj, const std::string& name);
// range, namespace, dict, raise_exception, strftime_now, joiner, cycler.
void install_globals(Interpreter& in);

// Binary arithmetic with Python semantics; op is one of + - * / // % **.
Value arithmetic(Interpreter& in, const std::string& op, const Value& a, const Value& b);
// Python `item in container`.
bool contains(const Value& container, const Value& item);
// Python "fmt % args".
std::string percent_format(Interpreter& in, const std::string& fmt, const Value& args);

}  // namespace osprey::jinja
