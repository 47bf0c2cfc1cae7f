// Incremental Server-Sent Events parser and the OpenAI streaming-chunk reader
// on top of it. Bytes arrive in arbitrary pieces (a line, an event or a UTF-8
// sequence may be split anywhere); events come out whole.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace osprey::bench {

// Splits a byte stream into events (WHATWG EventSource rules, reduced to what
// a benchmark needs): lines end in \n, \r\n or \r; "data:" lines of one event
// are joined with \n (one space after the colon dropped); a blank line ends
// the event; comment lines (":...") and other fields are ignored.
class SseParser {
 public:
  explicit SseParser(size_t max_event_bytes = size_t{16} << 20) : max_event_bytes_(max_event_bytes) {}

  // Feeds bytes; calls on_event(std::string_view data) for every completed
  // event that had at least one data line. Returns false (and stays failed)
  // when an event exceeds max_event_bytes.
  template <class F>
  bool feed(std::string_view bytes, F&& on_event) {
    if (failed_) return false;
    for (char c : bytes) {
      if (skip_lf_) {
        skip_lf_ = false;
        if (c == '\n') continue;
      }
      if (c == '\r' || c == '\n') {
        skip_lf_ = (c == '\r');
        if (line_.empty()) {
          if (has_data_) on_event(std::string_view(data_));
          data_.clear();
          has_data_ = false;
        } else {
          take_line();
          line_.clear();
        }
        continue;
      }
      line_.push_back(c);
      if (line_.size() + data_.size() > max_event_bytes_) {
        failed_ = true;
        return false;
      }
    }
    return true;
  }
  bool failed() const { return failed_; }
  // True when bytes of an unfinished event are buffered.
  bool has_partial() const { return !line_.empty() || has_data_; }

 private:
  void take_line();

  size_t max_event_bytes_;
  std::string line_;  // the current line, without its terminator
  std::string data_;  // data lines of the current event
  bool has_data_ = false;
  bool skip_lf_ = false;  // the previous byte was \r
  bool failed_ = false;
};

// What one OpenAI streaming event says.
struct ChunkInfo {
  bool done = false;            // "data: [DONE]"
  bool malformed = false;       // not JSON, or JSON of the wrong shape
  bool error = false;           // an {"error": ...} object in the stream
  bool has_token = false;       // carries generated text (choices[0].text or .delta.content / reasoning_content)
  size_t text_bytes = 0;
  bool has_usage = false;
  int prompt_tokens = 0, completion_tokens = 0;
  std::string error_message;
};

// Reads one event's data. keep_text: append the generated text to *text.
ChunkInfo parse_openai_chunk(std::string_view data, std::string* text);

}  // namespace osprey::bench
