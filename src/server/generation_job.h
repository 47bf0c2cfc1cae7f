// GenerationJob: one /v1/chat/completions or /v1/completions request in
// flight. It owns the engine requests (one per prompt, each with n
// sequences), receives their outputs on engine threads through callbacks,
// and turns them into SSE chunks or, at the end, one JSON response written
// through the connection's ResponseWriter. Never blocks an I/O thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/generation_backend.h"
#include "server/http_types.h"
#include "server/metrics.h"
#include "server/openai_format.h"
#include "server/openai_request.h"
#include "server/tool_parser.h"

namespace osprey::server {

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  using Clock = std::chrono::steady_clock;

  struct Prompt {
    std::vector<int32_t> token_ids;
    std::string echo_text;  // completions with echo: the prompt's text
  };

  GenerationJob(GenerationRequest request, std::vector<Prompt> prompts, ResponseMeta meta,
                std::shared_ptr<ResponseWriter> writer, std::shared_ptr<GenerationBackend> backend,
                std::shared_ptr<ServerMetrics> metrics, Clock::time_point arrival);

  // Called once, on an engine thread or in start(): when the job stops
  // counting as queued (first output, failure or end), and when it is over
  // (after the response was handed to the writer). Set before start().
  std::function<void()> on_dequeued;
  std::function<void(const GenerationJob&)> on_done;
  // Chat: parse each choice's text for tool calls in this format (kNone:
  // plain text). Set before start().
  ToolParserKind tool_parser = ToolParserKind::kNone;

  // Submits the engine requests (streaming: after the response head and the
  // role chunks). An error before anything was submitted is returned for the
  // caller to answer; later failures are reported in the response itself.
  std::optional<ApiError> start();
  // Aborts what is still running (client gone, or shutdown timeout); the
  // sequences finish with "abort".
  void cancel();
  const std::string& id() const { return meta_.id; }
  bool done() const { return done_.load(); }

 private:
  struct Choice {
    std::string text;
    nlohmann::ordered_json logprobs;  // accumulated (non-streaming)
    size_t lp_offset = 0;     // completions text_offset of the next token
    FinishReason finish = FinishReason::kNone;
    std::unique_ptr<ToolCallStream> tools;  // with a tool parser: splits text and calls
    std::vector<ToolCall> calls;            // parsed calls (non-streaming)
    int num_calls = 0;                      // calls sent or kept
    bool echoed = false;
    bool seen_token = false;
    int num_tokens = 0;
    Clock::time_point first_token, last_output;
  };
  struct Sub {
    std::string engine_id;
    std::shared_ptr<RequestStream> stream;
    Usage usage;
    bool got_queue_time = false;  // its queue time was observed
    bool finished = false;
  };

  void on_output(size_t sub, const RequestOutput& out);
  void process_locked(size_t sub, const RequestOutput& out);
  void dequeue_locked();
  void handle_echo(size_t sub, int choice, const RequestOutput& out, std::string& text, nlohmann::ordered_json& lp);
  void finish_locked();
  // Sends (streaming) or keeps one choice's new text, logprobs and tool calls.
  void deliver_locked(int idx, const std::string& text, std::vector<ToolCall> calls,
                      const nlohmann::ordered_json& chunk_lp, const RequestOutput& out);
  // The streamed chunk that ends a choice ("tool_calls" when it ended with calls).
  nlohmann::ordered_json finish_chunk_locked(int idx, FinishReason reason, const RequestOutput& out);
  Usage total_usage_locked() const;
  void emit(const nlohmann::ordered_json& chunk);

  GenerationRequest req_;
  std::vector<Prompt> prompts_;
  ResponseMeta meta_;
  std::shared_ptr<ResponseWriter> writer_;
  std::shared_ptr<GenerationBackend> backend_;
  std::shared_ptr<ServerMetrics> metrics_;
  Clock::time_point arrival_;

  std::mutex mu_;
  std::vector<Choice> choices_;  // prompts x n, prompt-major
  std::vector<Sub> subs_;
  size_t subs_left_ = 0;
  bool started_ = false;  // submits done; outputs before this wait in pending_
  bool failed_start_ = false;
  bool dequeued_ = false;
  bool any_token_ = false;
  bool cancelled_ = false;
  std::vector<std::pair<size_t, RequestOutput>> pending_;
  Status error_;
  std::atomic<bool> done_{false};
};

}  // namespace osprey::server
