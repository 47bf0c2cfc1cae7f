#include "engine/output_processor.h"

#include <algorithm>
#include <unordered_map>

namespace osprey {

RequestSink::RequestSink(std::string id_, const SamplingParams& params_, int num_prompt_tokens_,
                         std::span<const int32_t> prompt_tail_, OutputCallback callback_,
                         std::shared_ptr<EngineLink> link_)
    : id(std::move(id_)),
      params(params_),
      num_prompt_tokens(num_prompt_tokens_),
      prompt_tail(prompt_tail_.begin(), prompt_tail_.end()),
      callback(std::move(callback_)),
      link(std::move(link_)),
      seqs(params_.n) {
  for (auto& s : seqs) s.stop = StopStringMatcher(params.stop, params.include_stop_str_in_output);
  usage.prompt_tokens = num_prompt_tokens;
}

void RequestSink::deliver(RequestOutput out) {
  if (callback) {
    callback(out);
    if (out.finished) {
      std::lock_guard<std::mutex> lock(mutex);
      final_returned = true;
    }
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    queue.push_back(std::move(out));
  }
  cv.notify_all();
}

std::optional<RequestOutput> RequestStreamImpl::pop_locked() {
  RequestOutput out = std::move(sink_->queue.front());
  sink_->queue.pop_front();
  if (out.finished) sink_->final_returned = true;
  return out;
}

std::optional<RequestOutput> RequestStreamImpl::next() {
  std::unique_lock<std::mutex> lock(sink_->mutex);
  if (sink_->final_returned) return std::nullopt;
  sink_->cv.wait(lock, [&] { return !sink_->queue.empty(); });
  return pop_locked();
}

std::optional<RequestOutput> RequestStreamImpl::next_for(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(sink_->mutex);
  if (sink_->final_returned) return std::nullopt;
  if (!sink_->cv.wait_for(lock, timeout, [&] { return !sink_->queue.empty(); })) return std::nullopt;
  return pop_locked();
}

bool RequestStreamImpl::done() const {
  std::lock_guard<std::mutex> lock(sink_->mutex);
  return sink_->final_returned;
}

void RequestStreamImpl::cancel() {
  std::lock_guard<std::mutex> lock(sink_->link->mutex);
  if (sink_->link->abort) sink_->link->abort(sink_->key);
}

CompletionOutput& OutputProcessor::output_for(RequestOutput& ro, int index) {
  for (auto& o : ro.outputs)
    if (o.index == index) return o;
  ro.outputs.emplace_back();
  ro.outputs.back().index = index;
  return ro.outputs.back();
}

TokenLogprob OutputProcessor::convert(const LogprobData& d) const {
  TokenLogprob t;
  t.token_id = d.token_id;
  t.logprob = d.logprob;
  t.rank = d.rank;
  const int32_t one[1] = {d.token_id};
  t.token = codec_.decode(one, false);
  t.top.reserve(d.top.size());
  for (const auto& [id, lp] : d.top) {
    const int32_t x[1] = {id};
    t.top.push_back({id, lp, codec_.decode(x, false)});
  }
  return t;
}

void OutputProcessor::process(std::vector<SeqEvent>& events) {
  // One RequestOutput per request touched by this batch, in first-touch order.
  std::vector<std::pair<RequestSink*, RequestOutput>> outs;
  std::unordered_map<RequestSink*, size_t> where;
  for (SeqEvent& ev : events) {
    RequestSink& sink = *ev.sink;
    if (sink.num_finished >= sink.params.n) continue;
    if (ev.index < 0 || ev.index >= sink.params.n) continue;
    RequestSink::SeqOut& so = sink.seqs[ev.index];
    if (so.finished) continue;  // e.g. tokens computed after a stop string matched
    auto [it, fresh] = where.emplace(&sink, outs.size());
    if (fresh) {
      outs.emplace_back(&sink, RequestOutput{});
      outs.back().second.request_id = sink.id;
    }
    RequestOutput& ro = outs[it->second].second;
    sink.usage.cached_tokens = ev.num_cached_tokens;
    if (sink.first_scheduled_ns == 0) sink.first_scheduled_ns = ev.first_scheduled_ns;
    if (!ev.error.ok()) ro.error = ev.error;

    if (!ev.prompt_logprobs.empty()) {
      if (sink.prompt_logprobs.empty()) {
        TokenLogprob first;  // the first prompt token has no logprob
        first.token_id = sink.first_prompt_token;
        if (first.token_id >= 0) {
          const int32_t one[1] = {first.token_id};
          first.token = codec_.decode(one, false);
        }
        sink.prompt_logprobs.push_back(first);
      }
      for (const auto& d : ev.prompt_logprobs) sink.prompt_logprobs.push_back(convert(d));
    }
    const bool check_stops = true;
    CompletionOutput* co = nullptr;
    if (ev.token >= 0) {
      co = &output_for(ro, ev.index);
      ++so.num_tokens;
      ++sink.usage.completion_tokens;
      co->token_ids.push_back(ev.token);
      if (ev.logprobs) co->logprobs.push_back(convert(*ev.logprobs));
      if (!so.decoder) so.decoder = codec_.stream_decoder(sink.params.skip_special_tokens, sink.prompt_tail);
      const bool is_final_stop_token = ev.finish == FinishReason::kStop && ev.stop_token_id == ev.token;
      std::string delta;
      if (!is_final_stop_token || sink.params.include_stop_str_in_output) delta = so.decoder->step(ev.token);
      auto r = so.stop.append(delta, check_stops && so.num_tokens >= sink.params.min_tokens);
      co->text += r.emit;
      if (r.matched) {
        so.finished = true;
        co->finish_reason = FinishReason::kStop;
        co->stop_string = r.stop;
        if (ev.finish == FinishReason::kNone) {
          std::lock_guard<std::mutex> lock(sink.link->mutex);
          if (sink.link->finish_sequence) sink.link->finish_sequence(sink.key, ev.index);
        }
      }
    }
    if (ev.finish != FinishReason::kNone && !so.finished) {
      co = &output_for(ro, ev.index);
      if (so.decoder) {
        auto r = so.stop.append(so.decoder->finish(), so.num_tokens >= sink.params.min_tokens);
        co->text += r.emit;
        if (r.matched) {
          co->finish_reason = FinishReason::kStop;
          co->stop_string = r.stop;
        }
      }
      if (co->finish_reason == FinishReason::kNone) {
        co->text += so.stop.flush();
        co->finish_reason = ev.finish;
        co->stop_token_id = ev.stop_token_id;
      }
      so.finished = true;
    }
    if (so.finished && co && co->finish_reason != FinishReason::kNone) {
      ++sink.num_finished;
      if (sink.num_finished == sink.params.n) ro.finished = true;
    }
  }
  for (auto& [sink, ro] : outs) {
    if (!sink->prompt_logprobs_sent && !sink->prompt_logprobs.empty() &&
        (sink->prompt_logprobs.size() >= static_cast<size_t>(sink->num_prompt_tokens) || ro.finished ||
         !ro.outputs.empty())) {
      ro.prompt_logprobs = std::move(sink->prompt_logprobs);
      sink->prompt_logprobs_sent = true;
    }
    if (ro.outputs.empty() && ro.prompt_logprobs.empty() && !ro.finished) continue;  // nothing to say yet
    ro.usage = sink->usage;
    if (!sink->queue_time_sent && sink->first_scheduled_ns > 0) {
      sink->queue_time_sent = true;
      ro.queue_time_s = std::max<int64_t>(0, sink->first_scheduled_ns - sink->submit_ns) * 1e-9;
    }
    if (ro.finished) {
      // Before delivering: once a consumer sees the end, the id is free again.
      std::lock_guard<std::mutex> lock(sink->link->mutex);
      if (sink->link->on_request_done) sink->link->on_request_done(sink->id, sink->key);
    }
    sink->deliver(std::move(ro));
  }
}

OutputWorker::OutputWorker(const TextCodec& codec) : processor_(codec), thread_([this] { run(); }) {}

OutputWorker::~OutputWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void OutputWorker::post(std::vector<SeqEvent> events) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(events));
  }
  cv_.notify_one();
}

void OutputWorker::run() {
  while (true) {
    std::vector<SeqEvent> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      batch = std::move(queue_.front());
      queue_.pop_front();
    }
    processor_.process(batch);
  }
}

}  // namespace osprey
