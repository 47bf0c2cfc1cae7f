// Engine: the public API over EngineCore. Threads:
//   - callers: submit() validates and tokenizes on the calling thread;
//   - the engine loop: drains the inbox, runs EngineCore steps, posts events;
//   - output workers: detokenize, match stop strings, deliver outputs.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <variant>

#include "core/hash.h"
#include "engine/engine_core.h"
#include "engine/engine_impl.h"
#include "engine/output_processor.h"
#include "kv/kv_manager.h"
#include "kv/prefix_cache.h"

namespace osprey {

namespace {
struct AddCmd {
  std::unique_ptr<RequestState> req;
  std::vector<int32_t> prompt;
};
struct AbortCmd {
  uint64_t key = 0;
};
struct FinishSeqCmd {
  uint64_t key = 0;
  int index = 0;
};
using Command = std::variant<AddCmd, AbortCmd, FinishSeqCmd>;

}  // namespace

struct Engine::Impl {
  EngineConfig config;
  EngineParts parts;
  ModelInfo info;
  CoreConfig core_config;
  std::unique_ptr<EngineCore> core;
  std::shared_ptr<EngineLink> link = std::make_shared<EngineLink>();
  std::vector<std::unique_ptr<OutputWorker>> workers;

  std::mutex inbox_mutex;
  std::condition_variable inbox_cv;
  std::vector<Command> inbox;
  bool stopping = false;
  std::atomic<bool> stopped{false};
  std::thread loop;

  std::mutex live_mutex;
  std::unordered_map<std::string, std::shared_ptr<RequestSink>> live;
  uint64_t next_request_number = 0;
  uint64_t next_key = 1;
  std::mt19937_64 seed_rng;

  mutable std::mutex stats_mutex;
  EngineStats stats;
  int64_t decode_loop_ns = 0;  // loop thread only

  // False once the loop is stopping (the command is dropped): everything
  // posted before that is drained by the loop's shutdown path.
  bool post(Command c) {
    {
      std::lock_guard<std::mutex> lock(inbox_mutex);
      if (stopping) return false;
      inbox.push_back(std::move(c));
    }
    inbox_cv.notify_one();
    return true;
  }

  void dispatch(std::vector<SeqEvent>& events) {
    if (events.empty()) return;
    if (workers.size() == 1) {
      workers[0]->post(std::move(events));
    } else {
      std::vector<std::vector<SeqEvent>> per(workers.size());
      for (auto& e : events) per[std::hash<std::string>{}(e.sink->id) % workers.size()].push_back(std::move(e));
      for (size_t i = 0; i < workers.size(); ++i)
        if (!per[i].empty()) workers[i]->post(std::move(per[i]));
    }
    events.clear();
  }

  void update_stats() {
    const KvManager& kv = core->kv();
    const Scheduler& s = core->scheduler();
    std::lock_guard<std::mutex> lock(stats_mutex);
    stats.num_running = s.num_running();
    stats.num_waiting = s.num_waiting();
    stats.num_kv_blocks = kv.num_blocks();
    stats.num_free_kv_blocks = kv.num_free_blocks();
    stats.block_size = kv.block_size();
    stats.kv_usage = kv.num_blocks() ? 1.0 - static_cast<double>(kv.num_free_blocks()) / kv.num_blocks() : 0.0;
    stats.prefix_query_tokens = kv.stats().query_tokens;
    stats.prefix_hit_tokens = kv.stats().hit_tokens;
    stats.prefix_hit_rate = kv.stats().query_tokens
                                ? static_cast<double>(kv.stats().hit_tokens) / kv.stats().query_tokens
                                : 0.0;
    stats.num_prompt_tokens = core->stats().num_prompt_tokens;
    stats.num_generated_tokens = core->stats().num_generated_tokens;
    stats.num_preemptions = s.num_preemptions();
    stats.num_swap_outs = s.num_swap_outs();
    stats.num_swap_blocks = kv.num_swap_blocks();
    stats.num_free_swap_blocks = kv.num_free_swap_blocks();
    stats.num_steps = core->stats().num_steps;
    stats.num_finished_requests = core->stats().num_finished_requests;
    const CoreStats& cs = core->stats();
    stats.num_decode_steps = cs.num_decode_steps;
    stats.decode_tokens = cs.decode_tokens;
    stats.decode_schedule_ns = cs.decode_schedule_ns;
    stats.decode_build_ns = cs.decode_build_ns;
    stats.decode_forward_ns = cs.decode_forward_ns;
    stats.decode_update_ns = cs.decode_update_ns;
    stats.decode_sample_ns = cs.decode_sample_ns;
    stats.decode_loop_ns = decode_loop_ns;
    stats.decode_device_ns = cs.decode_device_ns;
    stats.num_timed_decode_steps = cs.num_timed_decode_steps;
    stats.num_overlapped_steps = core->num_overlapped_steps();
  }

  void run_loop() {
    std::vector<Command> cmds;
    std::vector<SeqEvent> events;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(inbox_mutex);
        inbox_cv.wait(lock, [&] { return stopping || !inbox.empty() || core->has_work(); });
        if (stopping) break;
        cmds.swap(inbox);
      }
      const auto t_loop_begin = std::chrono::steady_clock::now();  // after any wait
      for (Command& c : cmds) {
        if (auto* a = std::get_if<AddCmd>(&c)) {
          core->add_request(std::move(a->req), std::move(a->prompt));
        } else if (auto* ab = std::get_if<AbortCmd>(&c)) {
          core->abort_request(ab->key, events);
        } else if (auto* f = std::get_if<FinishSeqCmd>(&c)) {
          core->finish_sequence(f->key, f->index);
        }
      }
      cmds.clear();
      const int64_t decode_steps_before = core->stats().num_decode_steps;
      auto t_step_begin = std::chrono::steady_clock::now();
      if (core->has_work()) {
        Status st = core->step(events);
        (void)st;  // failures were reported to the requests as "error"
      }
      auto t_step_end = std::chrono::steady_clock::now();
      update_stats();
      dispatch(events);
      if (core->stats().num_decode_steps != decode_steps_before) {
        // Loop work around a decode step: commands before it, stats and dispatch after.
        decode_loop_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                              (t_step_begin - t_loop_begin) + (std::chrono::steady_clock::now() - t_step_end))
                              .count();
      }
    }
    // Shutdown: everything in flight (and still in the inbox) ends with "abort".
    {
      std::lock_guard<std::mutex> lock(inbox_mutex);
      cmds.swap(inbox);
    }
    for (Command& c : cmds)
      if (auto* a = std::get_if<AddCmd>(&c)) core->add_request(std::move(a->req), std::move(a->prompt));
    core->fail_all(FinishReason::kAbort, Status(StatusCode::kUnavailable, "the engine shut down"), events);
    update_stats();
    dispatch(events);
  }

  void shutdown() {
    if (stopped.exchange(true)) return;
    {
      std::lock_guard<std::mutex> lock(inbox_mutex);
      stopping = true;
    }
    inbox_cv.notify_all();
    if (loop.joinable()) loop.join();
    workers.clear();  // drains their queues
    std::lock_guard<std::mutex> lock(link->mutex);
    link->abort = nullptr;
    link->finish_sequence = nullptr;
    link->on_request_done = nullptr;
  }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() { shutdown(); }
void Engine::shutdown() {
  if (impl_) impl_->shutdown();
}

Expected<std::unique_ptr<Engine>> make_engine(const EngineConfig& config, EngineParts parts) {
  if (config.block_size <= 0 || config.block_size > 1024)
    return invalid_argument("block_size must be in [1, 1024], got " + std::to_string(config.block_size));
  if (config.max_num_batched_tokens <= 0) return invalid_argument("max_num_batched_tokens must be positive");
  if (config.max_num_seqs <= 0) return invalid_argument("max_num_seqs must be positive");
  if (!parts.executor || !parts.codec) return invalid_argument("engine needs an executor and a tokenizer");
  auto impl = std::make_unique<Engine::Impl>();
  impl->config = config;
  int num_blocks = config.num_kv_blocks;
  if (num_blocks <= 0) {
    if (parts.kv_bytes_per_token == 0) return invalid_argument("set num_kv_blocks (KV bytes per token unknown)");
    const int64_t per_block = static_cast<int64_t>(parts.kv_bytes_per_token) * config.block_size;
    num_blocks = static_cast<int>(std::min<int64_t>(config.kv_cache_bytes / per_block, 1 << 24));
    if (num_blocks <= 0)
      return resource_exhausted("kv_cache_bytes = " + std::to_string(config.kv_cache_bytes) +
                                " holds no KV page of " + std::to_string(per_block) + " bytes");
  }
  int max_len = config.max_model_len > 0 ? config.max_model_len : parts.model_max_len;
  if (max_len <= 0) max_len = 4096;
  if (config.max_model_len > 0 && parts.model_max_len > 0 && config.max_model_len > parts.model_max_len)
    return invalid_argument("max_model_len " + std::to_string(config.max_model_len) +
                            " exceeds the model's context length " + std::to_string(parts.model_max_len));

  CoreConfig& cc = impl->core_config;
  cc.scheduler.max_num_batched_tokens = config.max_num_batched_tokens;
  cc.scheduler.max_num_seqs = config.max_num_seqs;
  cc.scheduler.enable_chunked_prefill = config.enable_chunked_prefill;
  cc.scheduler.max_prompt_logprob_rows = std::max(1, config.max_prompt_logprob_rows);
  cc.scheduler.aging_steps = config.priority_aging_steps;
  cc.num_blocks = num_blocks;
  if (config.swap_space_bytes < 0) return invalid_argument("swap_space_bytes must not be negative");
  if (config.swap_space_bytes > 0) {
    if (parts.kv_bytes_per_token == 0) return invalid_argument("swap_space_bytes set but KV bytes per token unknown");
    const int64_t per_block = static_cast<int64_t>(parts.kv_bytes_per_token) * config.block_size;
    cc.num_swap_blocks = static_cast<int>(std::min<int64_t>(config.swap_space_bytes / per_block, 1 << 24));
    if (cc.num_swap_blocks <= 0)
      return resource_exhausted("swap_space_bytes = " + std::to_string(config.swap_space_bytes) +
                                " holds no KV page of " + std::to_string(per_block) + " bytes");
  }
  cc.block_size = config.block_size;
  cc.enable_prefix_caching = config.enable_prefix_caching;
  cc.cache_salt = fnv1a64(config.cache_salt.empty() ? parts.model_path + "|" + config.load_format
                                                        : config.cache_salt);
  cc.max_model_len = max_len;
  cc.async_scheduling = config.async_scheduling;
  cc.eos_token_ids = parts.eos_token_ids;
  if (auto e = parts.codec->eos_id();
      e && std::find(cc.eos_token_ids.begin(), cc.eos_token_ids.end(), *e) == cc.eos_token_ids.end())
    cc.eos_token_ids.push_back(*e);

  impl->info.model_path = parts.model_path;
  impl->info.vocab_size = parts.executor->vocab_size();
  impl->info.max_model_len = max_len;
  impl->info.num_kv_blocks = num_blocks;
  impl->info.block_size = config.block_size;
  impl->parts = std::move(parts);
  impl->core = std::make_unique<EngineCore>(cc, *impl->parts.executor);
  OSP_RETURN_IF_ERROR(impl->core->initialize());
  impl->seed_rng.seed(config.seed);
  const int num_workers = std::max(1, config.num_detokenizer_threads);
  for (int i = 0; i < num_workers; ++i)
    impl->workers.push_back(std::make_unique<OutputWorker>(*impl->parts.codec));

  Engine::Impl* raw = impl.get();
  raw->link->abort = [raw](uint64_t key) { (void)raw->post(AbortCmd{key}); };
  raw->link->finish_sequence = [raw](uint64_t key, int index) { (void)raw->post(FinishSeqCmd{key, index}); };
  raw->link->on_request_done = [raw](const std::string& id, uint64_t key) {
    std::lock_guard<std::mutex> lock(raw->live_mutex);
    auto it = raw->live.find(id);
    if (it != raw->live.end() && it->second->key == key) raw->live.erase(it);
  };
  raw->update_stats();
  raw->loop = std::thread([raw] { raw->run_loop(); });
  return std::make_unique<Engine>(std::move(impl));
}

Expected<std::shared_ptr<RequestStream>> Engine::submit(Request request, OutputCallback callback) {
  Impl& m = *impl_;
  if (m.stopped.load()) return Status(StatusCode::kUnavailable, "the engine is shut down");
  const int vocab = m.info.vocab_size;
  OSP_RETURN_IF_ERROR(request.params.validate(vocab));
  std::vector<int32_t> prompt = std::move(request.prompt_token_ids);
  if (prompt.empty()) {
    if (request.prompt.empty()) return invalid_argument("the prompt is empty");
    prompt = m.parts.codec->encode(request.prompt, request.add_special_tokens);
    if (prompt.empty())
      return invalid_argument(m.parts.text ? "the prompt encodes to no tokens"
                                           : "this model has no tokenizer (dummy weights without --tokenizer): "
                                             "send the prompt as token ids");
  }
  for (int32_t id : prompt)
    if (id < 0 || id >= vocab)
      return invalid_argument("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
  const int P = static_cast<int>(prompt.size());
  const CoreConfig& cc = m.core_config;
  if (P + 1 > cc.max_model_len)
    return out_of_range("the prompt has " + std::to_string(P) + " tokens; with at least one generated token it "
                        "exceeds the maximum context length of " + std::to_string(cc.max_model_len) + " tokens");
  if (KvManager::blocks_for(P + 1, cc.block_size) > cc.num_blocks)
    return resource_exhausted("the prompt has " + std::to_string(P) + " tokens; the whole KV cache holds " +
                              std::to_string(static_cast<int64_t>(cc.num_blocks) * cc.block_size) + " tokens");
  if (!cc.scheduler.enable_chunked_prefill && P > cc.scheduler.max_num_batched_tokens)
    return invalid_argument("the prompt has " + std::to_string(P) +
                            " tokens, more than max_num_batched_tokens (" +
                            std::to_string(cc.scheduler.max_num_batched_tokens) + ") with chunked prefill off");
  if (request.params.n > cc.scheduler.max_num_seqs)
    return invalid_argument("n = " + std::to_string(request.params.n) + " exceeds max_num_seqs (" +
                            std::to_string(cc.scheduler.max_num_seqs) + ")");

  auto req = std::make_unique<RequestState>();
  req->params = request.params;
  req->priority = request.priority;
  std::shared_ptr<RequestSink> sink;
  {
    std::lock_guard<std::mutex> lock(m.live_mutex);
    if (request.request_id.empty()) request.request_id = "req-" + std::to_string(m.next_request_number++);
    if (m.live.count(request.request_id))
      return invalid_argument("request id '" + request.request_id + "' is already in flight");
    req->seed = request.params.seed ? *request.params.seed : m.seed_rng();
    const size_t tail = std::min<size_t>(prompt.size(), 8);
    sink = std::make_shared<RequestSink>(request.request_id, request.params, P,
                                         std::span<const int32_t>(prompt.data() + P - tail, tail),
                                         std::move(callback), m.link);
    sink->first_prompt_token = prompt[0];
    sink->submit_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
    sink->key = m.next_key++;
    m.live.emplace(request.request_id, sink);
  }
  req->key = sink->key;
  req->id = request.request_id;
  req->sink = sink;
  if (!m.post(AddCmd{std::move(req), std::move(prompt)})) {
    std::lock_guard<std::mutex> lock(m.live_mutex);
    m.live.erase(request.request_id);
    return Status(StatusCode::kUnavailable, "the engine is shut down");
  }
  return std::shared_ptr<RequestStream>(std::make_shared<RequestStreamImpl>(sink));
}

bool Engine::cancel(const std::string& request_id) {
  uint64_t key = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->live_mutex);
    auto it = impl_->live.find(request_id);
    if (it == impl_->live.end()) return false;
    key = it->second->key;
  }
  return impl_->post(AbortCmd{key});
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mutex);
  return impl_->stats;
}

ModelInfo Engine::model_info() const { return impl_->info; }

ProfileReport Engine::profile() const { return impl_->parts.executor->profile(); }

void Engine::reset_profile() { impl_->parts.executor->reset_profile(); }

Expected<std::vector<int32_t>> Engine::encode(const std::string& text, bool add_special_tokens) const {
  return impl_->parts.codec->encode(text, add_special_tokens);
}

std::string Engine::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_->parts.codec->decode(ids, skip_special_tokens);
}

std::shared_ptr<const TextProcessor> Engine::text() const { return impl_->parts.text; }

}  // namespace osprey
