#include "tokenizer/jinja/interpreter.h"

#include <algorithm>

namespace osprey::jinja {
namespace {

[[noreturn]] void raise_undefined(const Value& u) {
  fail(u.undefined_hint().empty() ? std::string("value is undefined") : u.undefined_hint());
}

// Python slice index normalisation (PySlice_AdjustIndices): returns the
// selected indices of a sequence of length n.
std::vector<int64_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto as_index = [](const Value& v) -> int64_t {
    if (v.is_int()) return v.as_int();
    if (v.is_bool()) return v.as_bool();
    fail("slice indices must be integers or None");
  };
  int64_t step = (step_v.is_none() || step_v.is_undefined()) ? 1 : as_index(step_v);
  if (step == 0) fail("slice step cannot be zero");
  int64_t start, stop;
  if (start_v.is_none() || start_v.is_undefined()) {
    start = step < 0 ? n - 1 : 0;
  } else {
    start = as_index(start_v);
    if (start < 0) start = std::max<int64_t>(start + n, step < 0 ? -1 : 0);
    else if (start >= n) start = step < 0 ? n - 1 : n;
  }
  if (stop_v.is_none() || stop_v.is_undefined()) {
    stop = step < 0 ? -1 : n;
  } else {
    stop = as_index(stop_v);
    if (stop < 0) stop = std::max<int64_t>(stop + n, step < 0 ? -1 : 0);
    else if (stop >= n) stop = step < 0 ? n - 1 : n;
  }
  std::vector<int64_t> out;
  if (step > 0)
    for (int64_t i = start; i < stop; i += step) out.push_back(i);
  else
    for (int64_t i = start; i > stop; i += step) out.push_back(i);
  return out;
}

}  // namespace

Interpreter::Interpreter(const TemplateLimits& limits) : limits_(limits) {
  scope_.push_back(std::make_shared<Frame>());  // globals and context
  install_globals(*this);
}

void Interpreter::set_global(const std::string& name, Value v) { (*scope_.front())[name] = std::move(v); }

void Interpreter::step(int64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps) fail_limit("template evaluation exceeded max_steps");
}

void Interpreter::check_string_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) fail_limit("template string value exceeded max_output_bytes");
}

void Interpreter::check_list_size(size_t items) const {
  if (static_cast<int64_t>(items) > limits_.max_loop_iterations)
    fail_limit("template list value exceeded max_loop_iterations items");
}

void Interpreter::count_iteration() {
  if (++iterations_ > limits_.max_loop_iterations) fail_limit("template loops exceeded max_loop_iterations");
}

void Interpreter::append(std::string& out, std::string_view s) const {
  if (out.size() + s.size() > limits_.max_output_bytes) fail_limit("template output exceeded max_output_bytes");
  out.append(s);
}

std::string Interpreter::render(const Template& t) {
  scope_.push_back(std::make_shared<Frame>());  // template top level
  std::string out;
  try {
    exec_body(t.body, out);
  } catch (TemplateError& e) {
    if (e.line == 0) {
      e.line = line_;
      e.column = column_;
    }
    throw;
  }
  return out;
}

Value Interpreter::lookup(const std::string& name) const {
  for (auto it = scope_.rbegin(); it != scope_.rend(); ++it) {
    auto f = (*it)->find(name);
    if (f != (*it)->end()) return f->second;
  }
  return Value::undefined("'" + name + "' is undefined");
}

void Interpreter::assign(const std::string& name, Value v) { (*scope_.back())[name] = std::move(v); }

Interpreter::Flow Interpreter::exec_body(const Body& body, std::string& out) {
  for (const auto& s : body) {
    Flow f = exec(*s, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, std::string& out) {
  step();
  at(s.line, s.column);
  switch (s.kind) {
    case StmtKind::kText:
      append(out, s.text);
      return Flow::kNormal;
    case StmtKind::kPrint: {
      Value v = eval(*s.expr);
      if (v.is_string()) append(out, v.as_string());
      else append(out, v.str());
      return Flow::kNormal;
    }
    case StmtKind::kIf:
      if (eval(*s.expr).truthy()) return exec_body(s.body, out);
      return exec_body(s.else_body, out);
    case StmtKind::kFor:
      exec_for(s, out);
      return Flow::kNormal;
    case StmtKind::kSet:
      exec_set(s);
      return Flow::kNormal;
    case StmtKind::kSetBlock:
    case StmtKind::kFilterBlock: {
      std::string captured;
      exec_body(s.body, captured);
      Value v(std::move(captured));
      for (const auto& f : s.filters) {
        at(f->line, f->column);
        CallArgs args;
        eval_args(*f, 1, args);
        v = apply_filter(f->name, v, args);
      }
      if (s.kind == StmtKind::kSetBlock) assign(s.targets[0], v);
      else append(out, v.str());
      return Flow::kNormal;
    }
    case StmtKind::kMacro:
      assign(s.text, make_macro(s));
      return Flow::kNormal;
    case StmtKind::kCallBlock: {
      Value caller = make_macro(s, &s);
      const Expr& call_expr = *s.expr;
      Value fn = eval(*call_expr.children[0]);
      CallArgs args;
      eval_args(call_expr, 1, args);
      args.kw.emplace_back("caller", caller);
      at(s.line, s.column);
      append(out, call(fn, args).str());
      return Flow::kNormal;
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kScope:
      return exec_body(s.body, out);
  }
  return Flow::kNormal;
}

void Interpreter::exec_for(const Stmt& s, std::string& out) {
  Value seq = eval(*s.expr);
  std::vector<Value> items = iterate(seq);
  auto bind = [&](Frame& f, const Value& item) {
    if (s.targets.size() == 1) {
      f[s.targets[0]] = item;
      return;
    }
    std::vector<Value> parts = iterate(item);
    if (parts.size() != s.targets.size())
      fail("cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(s.targets.size()) +
           " loop variables");
    for (size_t i = 0; i < parts.size(); ++i) f[s.targets[i]] = parts[i];
  };
  if (s.cond) {
    std::vector<Value> kept;
    for (const auto& item : items) {
      count_iteration();
      auto frame = std::make_shared<Frame>();
      bind(*frame, item);
      scope_.push_back(frame);
      bool keep = eval(*s.cond).truthy();
      scope_.pop_back();
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto frame = std::make_shared<Frame>();
    scope_.push_back(frame);
    exec_body(s.else_body, out);
    scope_.pop_back();
    return;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    count_iteration();
    auto frame = std::make_shared<Frame>();
    bind(*frame, items[static_cast<size_t>(i)]);
    Dict loop;
    loop.items.reserve(12);
    loop.items.emplace_back("index", Value(i + 1));
    loop.items.emplace_back("index0", Value(i));
    loop.items.emplace_back("revindex", Value(n - i));
    loop.items.emplace_back("revindex0", Value(n - i - 1));
    loop.items.emplace_back("first", Value(i == 0));
    loop.items.emplace_back("last", Value(i == n - 1));
    loop.items.emplace_back("length", Value(n));
    loop.items.emplace_back("depth", Value(1));
    loop.items.emplace_back("depth0", Value(0));
    if (i > 0) loop.items.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
    if (i + 1 < n) loop.items.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
    loop.items.emplace_back("cycle", Value::callable("cycle", [i](Interpreter&, CallArgs& a) -> Value {
                              if (a.pos.empty()) fail("no items for cycling given");
                              return a.pos[static_cast<size_t>(i) % a.pos.size()];
                            }));
    (*frame)["loop"] = Value::dict(std::move(loop));
    scope_.push_back(frame);
    Flow f = exec_body(s.body, out);
    scope_.pop_back();
    if (f == Flow::kBreak) break;
  }
}

void Interpreter::exec_set(const Stmt& s) {
  Value v = eval(*s.expr);
  if (!s.attr.empty()) {
    Value target = lookup(s.targets[0]);
    if (!target.is_namespace()) fail("cannot assign attribute on non-namespace object");
    if (s.attr[0] == '_') fail("Chat templates cannot store underscore-prefixed attributes on a namespace");
    target.as_namespace().attrs.set(s.attr, std::move(v));
    return;
  }
  if (s.targets.size() == 1) {
    assign(s.targets[0], std::move(v));
    return;
  }
  std::vector<Value> parts = iterate(v);
  if (parts.size() != s.targets.size())
    fail("cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(s.targets.size()) +
         " variables");
  for (size_t i = 0; i < parts.size(); ++i) assign(s.targets[i], parts[i]);
}

// A macro (or the `caller` of a call block) closes over the scope where it is
// defined; frames are shared, so later top-level assignments stay visible.
Value Interpreter::make_macro(const Stmt& s, const Stmt* caller_of) {
  Scope closure = scope_;
  std::string name = caller_of ? "caller" : s.text;
  return Value::callable(name, [&s, closure, name](Interpreter& in, CallArgs& args) -> Value {
    if (in.call_depth_ >= in.limits_.max_recursion_depth) fail_limit("template recursion exceeded max_recursion_depth");
    auto frame = std::make_shared<Frame>();
    std::vector<Value> varargs;
    for (size_t i = 0; i < args.pos.size(); ++i) {
      if (i < s.targets.size()) (*frame)[s.targets[i]] = args.pos[i];
      else varargs.push_back(args.pos[i]);
    }
    Dict kwargs;
    for (auto& kv : args.kw) {
      bool is_param = std::find(s.targets.begin(), s.targets.end(), kv.first) != s.targets.end();
      if (is_param) {
        if (frame->count(kv.first)) fail("macro '" + name + "' got multiple values for argument '" + kv.first + "'");
        (*frame)[kv.first] = kv.second;
      } else if (kv.first == "caller") {
        (*frame)["caller"] = kv.second;
      } else {
        kwargs.set(kv.first, kv.second);
      }
    }
    (*frame)["varargs"] = Value::list(std::move(varargs), true);
    (*frame)["kwargs"] = Value::dict(std::move(kwargs));
    Scope saved = std::move(in.scope_);
    in.scope_ = closure;
    in.scope_.push_back(frame);
    ++in.call_depth_;
    struct Restore {
      Interpreter& in;
      Scope& saved;
      ~Restore() {
        in.scope_ = std::move(saved);
        --in.call_depth_;
      }
    } restore{in, saved};
    for (size_t i = 0; i < s.targets.size(); ++i) {
      if (frame->count(s.targets[i])) continue;
      (*frame)[s.targets[i]] = s.defaults[i] ? in.eval(*s.defaults[i])
                                              : Value::undefined("parameter '" + s.targets[i] + "' was not provided");
    }
    std::string out;
    in.exec_body(s.body, out);
    return Value(std::move(out));
  });
}

Value Interpreter::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) raise_undefined(fn);
  if (!fn.is_callable()) fail(std::string("'") + fn.type_name() + "' object is not callable");
  step();
  return fn.as_callable().fn(*this, args);
}

void Interpreter::eval_args(const Expr& e, size_t first, CallArgs& args) {
  size_t n = e.children.size();
  size_t num_kw = e.kw_names.size();
  for (size_t i = first; i < n - num_kw; ++i) args.pos.push_back(eval(*e.children[i]));
  for (size_t k = 0; k < num_kw; ++k) args.kw.emplace_back(e.kw_names[k], eval(*e.children[n - num_kw + k]));
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  std::vector<Value> out;
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return out;
    case Value::Kind::kList:
      step(static_cast<int64_t>(v.as_list().items.size()));
      return v.as_list().items;
    case Value::Kind::kDict:
      step(static_cast<int64_t>(v.as_dict().items.size()));
      for (const auto& kv : v.as_dict().items) out.emplace_back(kv.first);
      return out;
    case Value::Kind::kString: {
      step(static_cast<int64_t>(v.as_string().size()));
      for (uint32_t cp : utf8_decode(v.as_string())) {
        std::string c;
        utf8_append(c, cp);
        out.emplace_back(std::move(c));
      }
      return out;
    }
    default:
      fail(std::string("'") + v.type_name() + "' object is not iterable");
  }
}

Value Interpreter::get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) raise_undefined(obj);
  if (!name.empty() && name[0] == '_')
    return Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe.");
  if (obj.is_namespace()) {
    const Value* v = obj.as_namespace().attrs.find(name);
    if (v) return *v;
    return Value::undefined("'Namespace' object has no attribute '" + name + "'");
  }
  Value m = bound_method(*this, obj, name);
  if (!m.is_undefined()) return m;
  if (obj.is_dict()) {
    const Value* v = obj.as_dict().find(name);
    if (v) return *v;
    return Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  return Value::undefined(std::string("'") + obj.type_name() + " object' has no attribute '" + name + "'");
}

Value Interpreter::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) raise_undefined(obj);
  if (obj.is_dict()) {
    if (key.is_string()) {
      const Value* v = obj.as_dict().find(key.as_string());
      if (v) return *v;
    }
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.is_int() ? key.as_int() : key.as_bool();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.as_list().items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.as_list().items[static_cast<size_t>(i)];
    } else {
      std::vector<uint32_t> cps = utf8_decode(obj.as_string());
      int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) {
        std::string c;
        utf8_append(c, cps[static_cast<size_t>(i)]);
        return Value(std::move(c));
      }
    }
  } else if (obj.is_namespace() && key.is_string()) {
    return get_attr(obj, key.as_string());
  }
  if (key.is_string() && !obj.is_dict()) return get_attr(obj, key.as_string());
  if (key.is_string() && obj.is_dict()) {
    // jinja falls back to getattr: dict methods are reachable as d['items'].
    if (!key.as_string().empty() && key.as_string()[0] != '_') {
      Value m = bound_method(*this, obj, key.as_string());
      if (!m.is_undefined()) return m;
    }
    return Value::undefined("'dict object' has no attribute '" + key.as_string() + "'");
  }
  return Value::undefined(std::string("'") + obj.type_name() + " object' has no element " + key.repr());
}

Value Interpreter::apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  FilterFn f = find_filter(name);
  if (!f) fail("No filter named '" + name + "'.");
  step();
  return f(*this, input, args);
}

bool Interpreter::apply_test(const std::string& name, const Value& input, CallArgs& args) {
  TestFn t = find_test(name);
  if (!t) fail("No test named '" + name + "'.");
  step();
  return t(*this, input, args);
}

Value Interpreter::eval(const Expr& e) {
  step();
  at(e.line, e.column);
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName:
      return lookup(e.name);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.children.size());
      for (const auto& c : e.children) items.push_back(eval(*c));
      return Value::list(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        Value k = eval(*e.children[i]);
        Value v = eval(*e.children[i + 1]);
        d.set(k.is_string() ? k.as_string() : k.str(), std::move(v));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::kGetAttr:
      return get_attr(eval(*e.children[0]), e.name);
    case ExprKind::kGetItem: {
      Value obj = eval(*e.children[0]);
      Value key = eval(*e.children[1]);
      at(e.line, e.column);
      return get_item(obj, key);
    }
    case ExprKind::kSlice: {
      Value obj = eval(*e.children[0]);
      Value parts[3];
      for (int i = 0; i < 3; ++i)
        parts[i] = e.children[static_cast<size_t>(i) + 1] ? eval(*e.children[static_cast<size_t>(i) + 1]) : Value::none();
      at(e.line, e.column);
      if (obj.is_undefined()) raise_undefined(obj);
      if (obj.is_list()) {
        const auto& items = obj.as_list().items;
        auto idx = slice_indices(static_cast<int64_t>(items.size()), parts[0], parts[1], parts[2]);
        step(static_cast<int64_t>(idx.size()));
        std::vector<Value> out;
        out.reserve(idx.size());
        for (int64_t i : idx) out.push_back(items[static_cast<size_t>(i)]);
        return Value::list(std::move(out), obj.as_list().is_tuple);
      }
      if (obj.is_string()) {
        std::vector<uint32_t> cps = utf8_decode(obj.as_string());
        auto idx = slice_indices(static_cast<int64_t>(cps.size()), parts[0], parts[1], parts[2]);
        step(static_cast<int64_t>(idx.size()));
        std::string out;
        for (int64_t i : idx) utf8_append(out, cps[static_cast<size_t>(i)]);
        return Value(std::move(out));
      }
      fail(std::string("'") + obj.type_name() + "' object is not subscriptable");
    }
    case ExprKind::kCall:
      return eval_call(e);
    case ExprKind::kFilter: {
      Value input = eval(*e.children[0]);
      CallArgs args;
      eval_args(e, 1, args);
      at(e.line, e.column);
      return apply_filter(e.name, input, args);
    }
    case ExprKind::kTest: {
      Value input = eval(*e.children[0]);
      CallArgs args;
      eval_args(e, 1, args);
      at(e.line, e.column);
      return Value(apply_test(e.name, input, args) != e.negated);
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      Value v = eval(*e.children[0]);
      at(e.line, e.column);
      if (v.is_undefined()) raise_undefined(v);
      if (e.kind == ExprKind::kPos) {
        if (!v.is_number()) fail(std::string("bad operand type for unary +: '") + v.type_name() + "'");
        return v.is_bool() ? Value(int64_t{v.as_bool()}) : v;
      }
      if (v.is_float()) return Value(-v.as_float());
      if (v.is_bool()) return Value(-int64_t{v.as_bool()});
      if (v.is_int()) {
        if (v.as_int() == INT64_MIN) fail("integer overflow");
        return Value(-v.as_int());
      }
      fail(std::string("bad operand type for unary -: '") + v.type_name() + "'");
    }
    case ExprKind::kNot:
      return Value(!eval(*e.children[0]).truthy());
    case ExprKind::kAnd: {
      Value l = eval(*e.children[0]);
      if (!l.truthy()) return l;
      return eval(*e.children[1]);
    }
    case ExprKind::kOr: {
      Value l = eval(*e.children[0]);
      if (l.truthy()) return l;
      return eval(*e.children[1]);
    }
    case ExprKind::kBinary:
      return eval_binary(e);
    case ExprKind::kCompare:
      return eval_compare(e);
    case ExprKind::kCondExpr:
      if (eval(*e.children[0]).truthy()) return eval(*e.children[1]);
      if (e.children[2]) return eval(*e.children[2]);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
  }
  return Value::undefined();
}

Value Interpreter::eval_binary(const Expr& e) {
  Value a = eval(*e.children[0]);
  Value b = eval(*e.children[1]);
  at(e.line, e.column);
  if (e.name == "~") {
    std::string sa = a.str(), sb = b.str();
    check_string_size(sa.size() + sb.size());
    step(static_cast<int64_t>((sa.size() + sb.size()) / 64));
    return Value(sa + sb);
  }
  return arithmetic(*this, e.name, a, b);
}

Value Interpreter::eval_compare(const Expr& e) {
  Value left = eval(*e.children[0]);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.children[i + 1]);
    at(e.line, e.column);
    const std::string& op = e.ops[i];
    bool r;
    if (op == "==") r = values_equal(left, right);
    else if (op == "!=") r = !values_equal(left, right);
    else if (op == "in") r = contains(right, left);
    else if (op == "notin") r = !contains(right, left);
    else {
      if (left.is_undefined()) raise_undefined(left);
      if (right.is_undefined()) raise_undefined(right);
      int c = compare_values(left, right);
      r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!r) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Value Interpreter::eval_call(const Expr& e) {
  Value fn = eval(*e.children[0]);
  CallArgs args;
  eval_args(e, 1, args);
  at(e.line, e.column);
  return call(fn, args);
}

}  // namespace osprey::jinja
