// AST of a parsed template. Nodes own their children; a Template is
// immutable after parsing and shared between ChatTemplate copies.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace osprey::jinja {

enum class ExprKind {
  kConst,     // value
  kName,      // name
  kList,      // children: items
  kTuple,     // children: items
  kDict,      // children: key0, value0, key1, value1, ...
  kGetAttr,   // children[0].name
  kGetItem,   // children[0][children[1]]
  kSlice,     // children[0][children[1]:children[2]:children[3]] (null = omitted)
  kCall,      // children[0](children[1..]); the last kw_names.size() args are keyword args
  kFilter,    // children[0]|name(children[1..]); children[0] null in filter blocks
  kTest,      // children[0] is name(children[1..]); negated for `is not`
  kNeg,       // -children[0]
  kPos,       // +children[0]
  kNot,       // not children[0]
  kBinary,    // children[0] op children[1]; op in + - * / // % ** ~
  kAnd,
  kOr,
  kCompare,   // children[0] ops[0] children[1] ops[1] children[2] ... (chained)
  kCondExpr,  // children[1] if children[0] else children[2] (children[2] may be null)
};

struct Expr {
  ExprKind kind = ExprKind::kConst;
  int line = 0;
  int column = 0;
  Value value;                    // kConst
  std::string name;               // kName, kGetAttr, kFilter, kTest, kBinary (op)
  bool negated = false;           // kTest
  std::vector<std::unique_ptr<Expr>> children;
  std::vector<std::string> kw_names;  // keyword arg names of kCall/kFilter/kTest (trailing args)
  std::vector<std::string> ops;       // kCompare
};
using ExprPtr = std::unique_ptr<Expr>;

enum class StmtKind {
  kText,         // text
  kPrint,        // {{ expr }}
  kIf,           // if expr: body else else_body (elif is a nested kIf in else_body)
  kFor,          // for targets in expr [if cond]: body else else_body
  kSet,          // targets = expr; or ns_attr: targets[0].attr = expr
  kSetBlock,     // targets[0] = rendered body, through filters
  kMacro,        // macro name(params=defaults): body
  kCallBlock,    // call(params) expr: body (the body is `caller`)
  kFilterBlock,  // filter filters: body
  kBreak,
  kContinue,
  kScope,        // body rendered in place (generation blocks)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind = StmtKind::kText;
  int line = 0;
  int column = 0;
  std::string text;                  // kText; macro name
  ExprPtr expr;                      // print value, if/for/set expression, call expression
  ExprPtr cond;                      // for ... if cond
  std::vector<std::string> targets;  // for/set targets; macro/call params
  std::string attr;                  // kSet on a namespace: targets[0].attr
  std::vector<ExprPtr> defaults;     // macro/call params defaults (null = required)
  std::vector<ExprPtr> filters;      // kFilterBlock / kSetBlock: kFilter nodes with null operand
  Body body;
  Body else_body;
};

struct Template {
  std::string source;
  Body body;
};

}  // namespace osprey::jinja
