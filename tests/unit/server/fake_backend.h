// FakeBackend: a GenerationBackend without a model, for server tests. Byte
// tokenizer (token id = byte value, 256 = EOS), a trivial chat template, and
// a worker thread that emits one token per request every step: the bytes of
// `reply` in a loop ("ok " by default), then EOS unless ignore_eos.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "server/generation_backend.h"

namespace osprey::server::testing {

class FakeStream : public RequestStream {
 public:
  explicit FakeStream(std::string id, std::function<void(const std::string&)> cancel)
      : id_(std::move(id)), cancel_(std::move(cancel)) {}
  const std::string& request_id() const override { return id_; }
  std::optional<RequestOutput> next() override { return next_for(std::chrono::hours(1)); }
  std::optional<RequestOutput> next_for(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !q_.empty(); });
    if (q_.empty()) return std::nullopt;
    auto o = std::move(q_.front());
    q_.pop_front();
    if (o.finished) done_ = true;
    return o;
  }
  bool done() const override {
    std::lock_guard lock(mu_);
    return done_;
  }
  void cancel() override { cancel_(id_); }
  void push(RequestOutput o) {
    std::lock_guard lock(mu_);
    q_.push_back(std::move(o));
    cv_.notify_all();
  }

 private:
  std::string id_;
  std::function<void(const std::string&)> cancel_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> q_;
  bool done_ = false;
};

class FakeBackend : public GenerationBackend {
 public:
  static constexpr int32_t kEos = 256;
  std::string reply = "ok ";
  int reply_repeats = 2;                      // the reply's bytes this many times, then EOS
  std::optional<double> queue_time_s = 0.25;  // reported on each request's first output
  std::string template_source;                // chat_template_source()
  std::chrono::milliseconds step{2};
  std::chrono::milliseconds first_output_delay{0};  // "prefill" time before a request's first output
  int max_model_len = 512;
  std::atomic<int> num_submitted{0}, num_cancelled{0}, num_finished{0};

  FakeBackend() : worker_([this] { loop(); }) {}
  ~FakeBackend() override { shutdown(); }

  Expected<std::shared_ptr<RequestStream>> submit(Request r, OutputCallback cb) override {
    auto stream = std::make_shared<FakeStream>(r.request_id, [this](const std::string& id) { cancel(id); });
    std::lock_guard lock(mu_);
    if (stopped_) return Status(StatusCode::kUnavailable, "shut down");
    Active a;
    a.request = std::move(r);
    a.cb = std::move(cb);
    a.stream = stream;
    a.submitted = std::chrono::steady_clock::now();
    a.produced.assign(a.request.params.n, 0);
    a.finished.assign(a.request.params.n, false);
    active_.push_back(std::move(a));
    ++num_submitted;
    cv_.notify_all();
    return std::shared_ptr<RequestStream>(stream);
  }
  bool cancel(const std::string& id) override {
    std::lock_guard lock(mu_);
    for (auto& a : active_)
      if (a.request.request_id == id && !a.cancelled) {
        a.cancelled = true;
        ++num_cancelled;
        return true;
      }
    return false;
  }
  EngineStats stats() const override {
    std::lock_guard lock(mu_);
    EngineStats s;
    s.num_running = static_cast<int>(active_.size());
    s.num_kv_blocks = 100;
    s.num_free_kv_blocks = 100 - static_cast<int>(active_.size());
    s.kv_usage = active_.size() / 100.0;
    return s;
  }
  ModelInfo model_info() const override {
    ModelInfo m;
    m.model_path = "/fake/model.gguf";
    m.vocab_size = 257;
    m.max_model_len = max_model_len;
    return m;
  }
  std::vector<int32_t> encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string s;
    for (int32_t id : ids) {
      if (id == kEos) {
        if (!skip_special) s += "</s>";
      } else {
        s.push_back(static_cast<char>(id));
      }
    }
    return s;
  }
  Expected<std::string> apply_chat_template(const nlohmann::ordered_json& messages, const nlohmann::ordered_json&, bool add_gen,
                                            const nlohmann::ordered_json&) const override {
    std::string s;
    for (const auto& m : messages) {
      const auto c = m.find("content");
      s += m["role"].get<std::string>() + ": " + (c != m.end() && c->is_string() ? c->get<std::string>() : "") + "\n";
    }
    if (add_gen) s += "assistant:";
    return s;
  }
  std::string chat_template_source() const override { return template_source; }
  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      stopped_ = true;
      cv_.notify_all();
    }
    worker_.join();
  }

 private:
  struct Active {
    Request request;
    OutputCallback cb;
    std::shared_ptr<FakeStream> stream;
    std::vector<int> produced;
    std::vector<bool> finished;
    bool cancelled = false;
    bool first = true;
    std::chrono::steady_clock::time_point submitted;
  };

  void loop() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopped_ || !active_.empty(); });
      if (active_.empty() && stopped_) return;
      std::vector<std::pair<Active*, RequestOutput>> outs;
      const auto now = std::chrono::steady_clock::now();
      for (auto& a : active_)
        if (a.cancelled || stopped_ || now - a.submitted >= first_output_delay)
          outs.emplace_back(&a, make_output(a, stopped_));
      std::vector<std::pair<OutputCallback, RequestOutput>> calls;
      std::vector<std::pair<std::shared_ptr<FakeStream>, RequestOutput>> pushes;
      for (auto& [a, o] : outs) {
        if (a->cb)
          calls.emplace_back(a->cb, o);
        else
          pushes.emplace_back(a->stream, o);
      }
      active_.remove_if([](const Active& a) {
        for (bool f : a.finished)
          if (!f) return false;
        return true;
      });
      lock.unlock();
      for (auto& [cb, o] : calls) {
        if (o.finished) ++num_finished;
        cb(o);
      }
      for (auto& [s, o] : pushes) {
        if (o.finished) ++num_finished;
        s->push(o);
      }
      std::this_thread::sleep_for(step);
      lock.lock();
    }
  }

  RequestOutput make_output(Active& a, bool stopping) {
    RequestOutput o;
    o.request_id = a.request.request_id;
    const SamplingParams& p = a.request.params;
    if (a.first && p.prompt_logprobs >= 0) {
      for (size_t i = 0; i < a.request.prompt_token_ids.size(); ++i) {
        TokenLogprob t;
        t.token_id = a.request.prompt_token_ids[i];
        t.token = decode(std::span<const int32_t>(&t.token_id, 1), false);
        t.logprob = i == 0 ? 0.0f : -1.0f;
        o.prompt_logprobs.push_back(t);
      }
    }
    if (a.first) o.queue_time_s = queue_time_s;
    a.first = false;
    int total = 0;
    for (int k = 0; k < p.n; ++k) {
      if (a.finished[k]) continue;
      CompletionOutput c;
      c.index = k;
      if (a.cancelled || stopping) {
        c.finish_reason = FinishReason::kAbort;
      } else {
        const int i = a.produced[k]++;
        const bool eos = !p.ignore_eos && i >= static_cast<int>(reply.size()) * reply_repeats && i >= p.min_tokens;
        const int32_t id = eos ? kEos : static_cast<unsigned char>(reply[i % reply.size()]);
        c.token_ids.push_back(id);
        if (!eos) c.text = std::string(1, static_cast<char>(id));
        if (p.logprobs >= 0) {
          TokenLogprob t;
          t.token_id = id;
          t.token = decode(std::span<const int32_t>(&id, 1), false);
          t.logprob = -0.5f;
          t.rank = 1;
          for (int j = 0; j < p.logprobs; ++j) t.top.push_back({id + j, -0.5f - j, std::string(1, char('a' + j))});
          c.logprobs.push_back(t);
        }
        if (eos) {
          c.finish_reason = FinishReason::kStop;
          c.stop_token_id = kEos;
        } else if (a.produced[k] >= p.max_tokens) {
          c.finish_reason = FinishReason::kLength;
        }
      }
      if (c.finish_reason != FinishReason::kNone) a.finished[k] = true;
      o.outputs.push_back(std::move(c));
    }
    for (int k = 0; k < p.n; ++k) total += a.produced[k];
    o.finished = true;
    for (bool f : a.finished) o.finished = o.finished && f;
    o.usage.prompt_tokens = static_cast<int>(a.request.prompt_token_ids.size());
    o.usage.completion_tokens = total;
    return o;
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<Active> active_;
  bool stopped_ = false;
  std::thread worker_;
};

}  // namespace osprey::server::testing
