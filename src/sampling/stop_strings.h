// StopStringMatcher: finds stop strings in a sequence's detokenized text as
// it grows, and decides how much text is safe to emit: text that could be
// the beginning of a stop string is held back until it is known not to be.
//
// Invariant: emitted text never contains any part of a matched stop string
// (unless include_stop_str_in_output), and a stop string can never start
// inside already emitted text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace osprey {

class StopStringMatcher {
 public:
  StopStringMatcher() = default;
  StopStringMatcher(std::vector<std::string> stops, bool include_stop_in_output);

  struct Result {
    std::string emit;      // text to emit now
    bool matched = false;  // a stop string ended the sequence
    std::string stop;      // which one
  };
  // Adds a text delta. With check false (min_tokens not reached) stop
  // strings are not searched and nothing is held back.
  Result append(std::string_view delta, bool check = true);
  // The end of the sequence: the held-back text.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  bool include_ = false;
  std::string pending_;  // not yet emitted
};

}  // namespace osprey
