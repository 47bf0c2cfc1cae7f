// The output side of the engine: per-request sinks and streams, and the
// worker threads that turn the loop's SeqEvents into RequestOutputs
// (detokenization, stop strings, logprob token texts). A request always
// lands on the same worker, so its outputs stay in order.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_core.h"
#include "engine/text_codec.h"
#include "osprey/engine.h"
#include "sampling/stop_strings.h"

namespace osprey {

// What a sink needs from the engine: abort a request, or drop a sequence
// whose stop string matched. Cleared at shutdown (streams may outlive it).
struct EngineLink {
  std::mutex mutex;
  std::function<void(uint64_t key)> abort;
  std::function<void(uint64_t key, int index)> finish_sequence;
  std::function<void(const std::string& id, uint64_t key)> on_request_done;
};

struct RequestSink {
  RequestSink(std::string id_, const SamplingParams& params_, int num_prompt_tokens_,
              std::span<const int32_t> prompt_tail, OutputCallback callback_, std::shared_ptr<EngineLink> link_);

  // Immutable after construction.
  const std::string id;
  const SamplingParams params;
  const int num_prompt_tokens;
  const std::vector<int32_t> prompt_tail;  // left context for the detokenizer
  int32_t first_prompt_token = -1;
  const OutputCallback callback;
  const std::shared_ptr<EngineLink> link;
  uint64_t key = 0;  // the core's key of the request
  int64_t submit_ns = 0;  // steady-clock ns when submit() accepted it (RequestOutput::queue_time_s)

  // Output-worker state (one worker owns a sink).
  struct SeqOut {
    std::unique_ptr<StreamDecoder> decoder;
    StopStringMatcher stop;
    int num_tokens = 0;
    bool finished = false;
  };
  std::vector<SeqOut> seqs;          // [n], decoders made lazily
  std::vector<TokenLogprob> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  int num_finished = 0;
  int64_t first_scheduled_ns = 0;  // from the events (0: not yet scheduled)
  bool queue_time_sent = false;
  Usage usage;

  // Consumer side.
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<RequestOutput> queue;
  bool final_returned = false;

  void deliver(RequestOutput out);
};

class RequestStreamImpl final : public RequestStream {
 public:
  explicit RequestStreamImpl(std::shared_ptr<RequestSink> sink) : sink_(std::move(sink)) {}
  const std::string& request_id() const override { return sink_->id; }
  std::optional<RequestOutput> next() override;
  std::optional<RequestOutput> next_for(std::chrono::milliseconds timeout) override;
  bool done() const override;
  void cancel() override;

 private:
  std::optional<RequestOutput> pop_locked();
  std::shared_ptr<RequestSink> sink_;
};

// Builds RequestOutputs from SeqEvents for the sinks it owns.
class OutputProcessor {
 public:
  explicit OutputProcessor(const TextCodec& codec) : codec_(codec) {}
  // Processes one step's events (in order) and delivers one output per request.
  void process(std::vector<SeqEvent>& events);

 private:
  CompletionOutput& output_for(RequestOutput& ro, int index);
  TokenLogprob convert(const LogprobData& d) const;
  const TextCodec& codec_;
};

// A thread running an OutputProcessor over queued event batches.
class OutputWorker {
 public:
  explicit OutputWorker(const TextCodec& codec);
  ~OutputWorker();  // drains the queue, then joins
  void post(std::vector<SeqEvent> events);

 private:
  void run();
  OutputProcessor processor_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::vector<SeqEvent>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace osprey
