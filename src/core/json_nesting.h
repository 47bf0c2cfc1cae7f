// JsonNesting: the bracket depth of JSON text read one character at a time,
// ignoring brackets inside string literals. A cheap structural guard run
// before untrusted text reaches a JSON parser (depth limits), and a way to
// find where an embedded object or array ends.
#pragma once

namespace osprey {

class JsonNesting {
 public:
  // Consumes c: +1 when it opens an object or array, -1 when it closes one,
  // 0 otherwise. depth() is the nesting after c.
  int feed(char c) {
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      return 0;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
      return 1;
    } else if (c == '}' || c == ']') {
      --depth_;
      return -1;
    }
    return 0;
  }
  int depth() const { return depth_; }

 private:
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
};

}  // namespace osprey
