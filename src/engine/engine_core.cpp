#include "engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/check.h"
#include "engine/batch_builder.h"

namespace osprey {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// OSPREY_STEP_TRACE=<file>: one line per finished step, "step seqs tokens
// decode_only device_us wall_us before_us forward_us after_us" (device
// times -1 where the executor has none; wall_us: when the step was waited
// for, from the first traced step; before/forward/after: the device time
// split around the forward, Executor::last_step_phases), to compare the
// engine's steps with model_bench's at the same shapes and to see what a
// step costs the wall clock. The file is opened once per process, on first
// use (null: unset or not openable); lines from several engines interleave.
std::FILE* step_trace_file() {
  static std::FILE* const f = [] {
    const char* path = std::getenv("OSPREY_STEP_TRACE");
    if (!path || !*path) return static_cast<std::FILE*>(nullptr);
    std::FILE* file = std::fopen(path, "w");
    if (!file) std::fprintf(stderr, "OSPREY_STEP_TRACE: cannot open %s for writing; no step trace\n", path);
    return file;
  }();
  return f;
}

void trace_step(int64_t id, size_t seqs, int tokens, bool decode_only, int64_t device_ns,
                const Executor::StepPhases& ph) {
  static std::mutex mu;
  static int64_t t0 = 0;
  std::FILE* f = step_trace_file();
  if (!f) return;
  const std::lock_guard<std::mutex> lock(mu);
  const int64_t now = now_ns();
  if (t0 == 0) t0 = now;
  auto us = [](int64_t ns) { return ns >= 0 ? 1e-3 * static_cast<double>(ns) : -1.0; };
  std::fprintf(f, "%lld %zu %d %d %.1f %.1f %.1f %.1f %.1f\n", static_cast<long long>(id), seqs, tokens,
               decode_only ? 1 : 0, us(device_ns), 1e-3 * static_cast<double>(now - t0), us(ph.before_ns),
               us(ph.forward_ns), us(ph.after_ns));
  std::fflush(f);
}
}  // namespace

EngineCore::EngineCore(const CoreConfig& config, Executor& executor)
    : config_(config),
      executor_(executor),
      kv_(config.num_blocks, config.block_size, config.enable_prefix_caching, config.cache_salt,
          config.num_swap_blocks),
      scheduler_(config.scheduler, kv_),
      sampler_(executor.vocab_size()) {}

Status EngineCore::initialize() {
  executor_.set_limits(config_.scheduler.max_num_seqs, config_.max_model_len);
  OSP_RETURN_IF_ERROR(executor_.initialize(config_.num_blocks, config_.block_size,
                                           config_.scheduler.max_num_batched_tokens, scheduler_.max_logit_rows()));
  if (config_.num_swap_blocks > 0) OSP_RETURN_IF_ERROR(executor_.initialize_swap(config_.num_swap_blocks));
  async_ = config_.async_scheduling && executor_.supports_async_steps();
  if (step_trace_file()) executor_.set_step_phases(true);
  return Status::Ok();
}

void EngineCore::add_request(std::unique_ptr<RequestState> req, std::vector<int32_t> prompt) {
  OSP_CHECK(!prompt.empty());
  OSP_CHECK(requests_.find(req->key) == requests_.end());
  req->arrival = next_arrival_++;
  scheduler_.assign_rank(*req);
  req->seqs.clear();
  auto seq = std::make_unique<Sequence>();
  seq->req = req.get();
  seq->index = 0;
  seq->num_prompt_tokens = static_cast<int>(prompt.size());
  seq->tokens = std::move(prompt);
  seq->tokens.reserve(seq->tokens.size() + req->params.max_tokens + 1);
  scheduler_.add_waiting(seq.get());
  req->seqs.push_back(std::move(seq));
  req->num_live = 1;
  requests_.emplace(req->key, std::move(req));
}

void EngineCore::release_request_if_done(RequestState& req) {
  if (req.num_live > 0) return;
  ++stats_.num_finished_requests;
  requests_.erase(req.key);  // destroys req
}

void EngineCore::finish(Sequence& seq, FinishReason reason, int32_t stop_token, std::vector<SeqEvent>& events,
                        SeqEvent* ev) {
  if (seq.status == SeqStatus::kFinished) return;
  scheduler_.remove(&seq);
  drop_inflight(seq);
  RequestState& req = *seq.req;
  // An unforked request with n > 1 finishing early finishes all n indices.
  const int num_indices = req.forked ? 1 : req.params.n;
  for (int k = 0; k < num_indices; ++k) {
    SeqEvent* e = ev;
    if (k > 0 || !e) {
      events.emplace_back();
      e = &events.back();
      e->sink = req.sink;
      e->index = seq.index + k;
      e->num_cached_tokens = std::max(0, req.num_cached_tokens);
      e->first_scheduled_ns = req.first_scheduled_ns;
    }
    e->finish = reason;
    e->stop_token_id = stop_token;
    ev = nullptr;
  }
  --req.num_live;
}

bool EngineCore::abort_request(uint64_t key, std::vector<SeqEvent>& events) {
  auto it = requests_.find(key);
  if (it == requests_.end()) return false;
  RequestState& req = *it->second;
  for (auto& s : req.seqs) finish(*s, FinishReason::kAbort, -1, events, nullptr);
  release_request_if_done(req);
  return true;
}

void EngineCore::finish_sequence(uint64_t key, int index) {
  auto it = requests_.find(key);
  if (it == requests_.end()) return;
  RequestState& req = *it->second;
  if (!req.forked) {
    // Only index 0 exists; the others are finished with it only when n == 1.
    if (req.params.n != 1) return;
  }
  if (index < 0 || index >= static_cast<int>(req.seqs.size())) return;
  Sequence& seq = *req.seqs[index];
  if (seq.status == SeqStatus::kFinished) return;
  scheduler_.remove(&seq);
  drop_inflight(seq);
  --req.num_live;
  release_request_if_done(req);
}

void EngineCore::drop_inflight(Sequence& seq) {
  if (seq.inflight_step < 0) return;
  for (int i = 0; i < num_inflight_; ++i) {
    InflightStep& rec = inflight(i);
    if (rec.id != seq.inflight_step) continue;
    const size_t slot = static_cast<size_t>(seq.inflight_slot);
    if (slot < rec.seqs.size() && rec.seqs[slot].seq == &seq) rec.seqs[slot].seq = nullptr;
  }
  seq.inflight_step = -1;
  seq.inflight_slot = -1;
}

void EngineCore::fail_all(FinishReason reason, const Status& error, std::vector<SeqEvent>& events) {
  // Steps in flight end first (their results are dropped): nothing is left
  // queued on the executor, and no row refers to a sequence destroyed below.
  while (num_inflight_ > 0) {
    (void)executor_.wait_step();
    inflight_head_ = (inflight_head_ + 1) % static_cast<int>(inflight_.size());
    --num_inflight_;
  }
  std::vector<uint64_t> keys;
  keys.reserve(requests_.size());
  for (auto& [key, r] : requests_) keys.push_back(key);
  for (uint64_t key : keys) {
    RequestState& req = *requests_.at(key);
    const size_t first = events.size();
    for (auto& s : req.seqs) finish(*s, reason, -1, events, nullptr);
    for (size_t i = first; i < events.size(); ++i) events[i].error = error;
    release_request_if_done(req);
  }
}

void EngineCore::fill_stop_ids(const SamplingParams& p) {
  stop_ids_scratch_.clear();
  if (!p.ignore_eos) stop_ids_scratch_ = config_.eos_token_ids;
  stop_ids_scratch_.insert(stop_ids_scratch_.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
}

void EngineCore::plan_device_sampling(InflightStep& rec) {
  // Rows the device samples: every sampled token whose parameters it
  // handles, within its limits; everything else (prompt logprobs, the rest)
  // needs the logits on the host.
  const DeviceSamplingLimits lim = executor_.device_sampling_limits();
  rec.sample_task.assign(sched_out_.seqs.size(), -1);
  bool host = false;
  int scratch_rows = 0;
  for (size_t i = 0; i < sched_out_.seqs.size(); ++i) {
    const ScheduledSeq& ss = sched_out_.seqs[i];
    if (ss.num_prompt_logprob_rows > 0) host = true;
    if (!ss.sample) continue;
    Sequence& seq = *ss.seq;
    const RequestState& req = *seq.req;
    const SamplingParams& p = req.params;
    const bool fork = req.forks_at_next_sample();
    const int count = fork ? p.n : 1;
    const int first = static_cast<int>(batch_.sample_rows.size());
    if (lim.max_rows == 0 || !device_can_sample(p) || first + count > lim.max_rows) {
      host = true;
      continue;
    }
    // A pending token is never in the output a device row lists (no step
    // with penalties is overlapped: penalties need every earlier token on
    // the host).
    OSP_CHECK(seq.num_pending == 0 || !uses_penalties(p));
    if (uses_penalties(p)) seq.penalties.sync(p, seq.tokens, seq.num_prompt_tokens);
    fill_stop_ids(p);
    const size_t edit_mark = batch_.sample_edits.ids.size();
    const int scratch_mark = scratch_rows;
    for (int k = 0; k < count; ++k) {
      DeviceSampleRow r;
      r.logit_row = ss.first_logit_row + ss.num_prompt_logprob_rows;
      const size_t before = batch_.sample_edits.ids.size();
      make_device_sample_row(p, seq.penalties, seq.num_output(), stop_ids_scratch_, req.seed, seq.index + k,
                             seq.num_tokens(), r, batch_.sample_edits);
      r.scratch_row = batch_.sample_edits.ids.size() > before ? scratch_rows++ : -1;
      batch_.sample_rows.push_back(r);
    }
    if (scratch_rows > lim.max_scratch_rows || static_cast<int>(batch_.sample_edits.ids.size()) > lim.max_edits) {
      // Over the device's limits: this sequence samples on the host.
      batch_.sample_rows.resize(static_cast<size_t>(first));
      batch_.sample_edits.ids.resize(edit_mark);
      batch_.sample_edits.vals.resize(edit_mark);
      scratch_rows = scratch_mark;
      host = true;
      continue;
    }
    rec.sample_task[i] = first;
  }
  batch_.need_host_logits = host;
}

void EngineCore::sample_into(Sequence& seq, int index, const float* row, const DeviceSampleResult* device,
                             std::vector<SeqEvent>& events) {
  RequestState& req = *seq.req;
  const SamplingParams& p = req.params;
  SampleResult r;
  const int64_t t0 = now_ns();
  if (device) {
    r.token = device->token;
    if (p.logprobs >= 0) {
      LogprobData d;
      d.token_id = device->token;
      d.logprob = device->logprob;
      d.rank = device->rank;
      const int k = std::min(p.logprobs, kMaxDeviceTopLogprobs);
      d.top.reserve(static_cast<size_t>(k));
      for (int i = 0; i < k; ++i) d.top.emplace_back(device->top_ids[i], device->top_logprobs[i]);
      r.logprobs = std::move(d);
    }
  } else {
    // Every token before `index` is known: host-sampled steps are never overlapped.
    OSP_CHECK_EQ(seq.num_known(), index);
    fill_stop_ids(p);
    SampleInput in;
    in.params = &p;
    in.prompt = std::span<const int32_t>(seq.tokens.data(), seq.num_prompt_tokens);
    in.output = std::span<const int32_t>(seq.tokens.data() + seq.num_prompt_tokens, index - seq.num_prompt_tokens);
    in.stop_ids = stop_ids_scratch_;
    if (uses_penalties(p)) {
      seq.penalties.sync(p, std::span<const int32_t>(seq.tokens.data(), static_cast<size_t>(index)),
                         seq.num_prompt_tokens);
      in.penalties = &seq.penalties;
    }
    in.seed = req.seed;
    in.seq_index = seq.index;
    in.position = index;
    r = sampler_.sample(row, in);
  }
  step_sample_ns_ += now_ns() - t0;

  if (index == seq.num_tokens()) {
    seq.tokens.push_back(r.token);
  } else {
    // The oldest pending placeholder.
    OSP_CHECK(seq.num_pending > 0 && index == seq.num_known() && seq.tokens[index] == kPendingToken);
    seq.tokens[static_cast<size_t>(index)] = r.token;
    --seq.num_pending;
  }
  ++stats_.num_generated_tokens;
  events.emplace_back();
  SeqEvent& ev = events.back();
  ev.sink = req.sink;
  ev.index = seq.index;
  ev.token = r.token;
  ev.logprobs = std::move(r.logprobs);
  ev.num_cached_tokens = std::max(0, req.num_cached_tokens);
  ev.first_scheduled_ns = req.first_scheduled_ns;

  const int out_len = index + 1 - seq.num_prompt_tokens;
  if (out_len >= p.min_tokens) {
    const bool is_eos = !p.ignore_eos && std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(),
                                                   r.token) != config_.eos_token_ids.end();
    const bool is_stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), r.token) != p.stop_token_ids.end();
    if (is_eos || is_stop) {
      finish(seq, FinishReason::kStop, r.token, events, &events.back());
      return;
    }
  }
  if (out_len >= p.max_tokens || index + 1 >= config_.max_model_len)
    finish(seq, FinishReason::kLength, -1, events, &events.back());
}

Status EngineCore::step(std::vector<SeqEvent>& events) {
  // The step in flight must be done before the next is built unless it allows overlap.
  if (num_inflight_ > 0 && !inflight(num_inflight_ - 1).next_may_overlap) OSP_RETURN_IF_ERROR(finish_oldest(events));
  bool launched = false;
  OSP_RETURN_IF_ERROR(launch_next(events, launched));
  // Asynchronously the newest step stays in flight across the call (the
  // loop handles commands and posts events while the device runs it).
  const int keep = async_ && launched ? 1 : 0;
  while (num_inflight_ > keep) OSP_RETURN_IF_ERROR(finish_oldest(events));
  return Status::Ok();
}

Status EngineCore::launch_next(std::vector<SeqEvent>& events, bool& launched) {
  launched = false;
  const int64_t t0 = now_ns();
  scheduler_.schedule(sched_out_);
  const int64_t t1 = now_ns();
  for (Sequence* seq : sched_out_.cannot_grow) {
    RequestState& req = *seq->req;
    finish(*seq, FinishReason::kLength, -1, events, nullptr);
    release_request_if_done(req);
  }
  // Nothing to compute, but victims swapped out this step must still be
  // copied before their pages are reused: a step of copies only.
  if (sched_out_.seqs.empty() && sched_out_.swap_out.empty()) return Status::Ok();
  OSP_CHECK_LT(num_inflight_, static_cast<int>(inflight_.size()));
  InflightStep& rec = inflight_[(inflight_head_ + num_inflight_) % inflight_.size()];
  rec.id = next_step_id_++;
  rec.begin.clear();
  rec.token_index.clear();
  rec.num_tokens = sched_out_.num_tokens;
  rec.decode_only = !sched_out_.seqs.empty() && sched_out_.num_tokens == static_cast<int>(sched_out_.seqs.size());
  build_step_batch(sched_out_, config_.block_size, batch_);  // sets first_logit_row
  rec.seqs.assign(sched_out_.seqs.begin(), sched_out_.seqs.end());
  if (!rec.seqs.empty()) {
    ++stats_.num_steps;
    plan_device_sampling(rec);
  } else {
    rec.sample_task.clear();
    batch_.need_host_logits = false;
  }
  const int64_t t2 = now_ns();
  const bool overlapped = num_inflight_ > 0;
  if (Status st = executor_.launch_step(batch_); !st.ok()) {
    fail_all(FinishReason::kError, st, events);
    return st;
  }
  const int64_t t3 = now_ns();
  ++num_inflight_;
  launched = true;
  if (overlapped) ++num_overlapped_;

  // Advance every sequence past the step as if it were done: the next
  // schedule sees the positions computed and the sampled tokens (pending).
  bool may_overlap = async_ && !batch_.need_host_logits;
  for (size_t si = 0; si < rec.seqs.size(); ++si) {
    const ScheduledSeq& ss = rec.seqs[si];
    Sequence& seq = *ss.seq;
    RequestState& req = *seq.req;
    if (req.first_scheduled_ns == 0) req.first_scheduled_ns = t0;
    const int begin = seq.num_computed;
    rec.begin.push_back(begin);
    seq.num_computed += ss.num_new;
    if (begin < seq.num_prompt_tokens)
      stats_.num_prompt_tokens += std::min(seq.num_computed, seq.num_prompt_tokens) - begin;
    kv_.cache_blocks(seq.table, seq.tokens, std::min(seq.num_computed, seq.num_known()));
    seq.inflight_step = rec.id;
    seq.inflight_slot = static_cast<int>(si);
    if (!ss.sample) {
      rec.token_index.push_back(-1);
      continue;
    }
    const SamplingParams& p = req.params;
    const bool fork = req.forks_at_next_sample();
    rec.token_index.push_back(seq.num_tokens());
    seq.tokens.push_back(kPendingToken);
    ++seq.num_pending;
    seq.pending_sample_row = rec.sample_task[si];
    // Known now to finish with this step (or to fork): not scheduled again before it is waited for.
    seq.hold = fork || seq.num_output() >= p.max_tokens || seq.num_tokens() >= config_.max_model_len;
    if (fork || uses_penalties(p)) may_overlap = false;
  }
  rec.next_may_overlap = may_overlap;
  rec.schedule_ns = t1 - t0;
  rec.build_ns = t2 - t1;
  rec.launch_ns = t3 - t2;
  rec.advance_ns = now_ns() - t3;
  return Status::Ok();
}

Status EngineCore::finish_oldest(std::vector<SeqEvent>& events) {
  OSP_CHECK_GT(num_inflight_, 0);
  InflightStep& rec = inflight(0);
  const int64_t t0 = now_ns();
  Expected<StepOutput> out = executor_.wait_step();
  const int64_t t1 = now_ns();
  step_sample_ns_ = 0;
  if (!out.ok()) {
    inflight_head_ = (inflight_head_ + 1) % static_cast<int>(inflight_.size());
    --num_inflight_;
    fail_all(FinishReason::kError, out.status(), events);
    return out.status();
  }
  const int vocab = executor_.vocab_size();
  const float* base = out->logits;
  const DeviceSampleResult* samples = out->samples;

  // Requests touched this step; released after the loop so that no
  // ScheduledSeq points into a destroyed request.
  std::vector<RequestState*>& touched = touched_scratch_;
  touched.clear();
  for (size_t si = 0; si < rec.seqs.size(); ++si) {
    const ScheduledSeq ss = rec.seqs[si];
    if (!ss.seq) {  // finished while in flight: its row is dropped
      ++stats_.num_dropped_rows;
      continue;
    }
    Sequence& seq = *ss.seq;
    RequestState& req = *seq.req;
    touched.push_back(&req);
    if (seq.inflight_step == rec.id) {
      // Its newest step: nothing of it is in flight any more.
      seq.inflight_step = -1;
      seq.inflight_slot = -1;
      seq.hold = false;
    }
    if (ss.num_prompt_logprob_rows > 0) {
      OSP_CHECK(base);
      events.emplace_back();
      SeqEvent& ev = events.back();
      ev.sink = req.sink;
      ev.index = seq.index;
      ev.num_cached_tokens = std::max(0, req.num_cached_tokens);
      ev.first_scheduled_ns = req.first_scheduled_ns;
      const int lp_begin = std::max(rec.begin[si], seq.prompt_logprob_pos);
      for (int r = 0; r < ss.num_prompt_logprob_rows; ++r) {
        const int pos = lp_begin + r;
        const float* row = base + static_cast<size_t>(ss.first_logit_row + r) * vocab;
        ev.prompt_logprobs.push_back(compute_logprobs(std::span<const float>(row, vocab), seq.tokens[pos + 1],
                                                      req.params.prompt_logprobs));
      }
      seq.prompt_logprob_pos = lp_begin + ss.num_prompt_logprob_rows;
    }
    if (!ss.sample) continue;
    const int task = rec.sample_task[si];
    const DeviceSampleResult* device = task >= 0 ? samples + task : nullptr;
    OSP_CHECK(device || base);
    const float* row =
        device ? nullptr : base + static_cast<size_t>(ss.first_logit_row + ss.num_prompt_logprob_rows) * vocab;
    const int index = rec.token_index[si];
    if (req.forks_at_next_sample()) {
      // First token of an n > 1 request: the siblings share the prompt's
      // pages. The step was not overlapped: its placeholder is the last token.
      OSP_CHECK_EQ(seq.index, 0);
      OSP_CHECK(seq.num_pending == 1 && index == seq.num_tokens() - 1);
      seq.tokens.pop_back();
      seq.num_pending = 0;
      req.forked = true;
      for (int k = 1; k < req.params.n; ++k) {
        auto child = std::make_unique<Sequence>();
        child->req = &req;
        child->index = k;
        child->tokens = seq.tokens;
        child->num_prompt_tokens = seq.num_prompt_tokens;
        child->num_computed = seq.num_computed;
        child->prompt_logprob_pos = seq.num_prompt_tokens;
        child->penalties = seq.penalties;
        kv_.fork(seq.table, child->table);
        scheduler_.add_running(child.get());
        req.seqs.push_back(std::move(child));
      }
      req.num_live = req.params.n;
      for (int k = 0; k < req.params.n; ++k)
        sample_into(*req.seqs[k], req.seqs[k]->num_tokens(), row, device ? device + k : nullptr, events);
    } else {
      sample_into(seq, index, row, device, events);
    }
    // Pages completed by the token just resolved (positions computed and known).
    if (seq.status != SeqStatus::kFinished)
      kv_.cache_blocks(seq.table, seq.tokens, std::min(seq.num_computed, seq.num_known()));
  }
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (RequestState* r : touched) release_request_if_done(*r);
  trace_step(rec.id, rec.seqs.size(), rec.num_tokens, rec.decode_only, executor_.last_step_device_ns(),
             executor_.last_step_phases());
  if (rec.decode_only) {
    ++stats_.num_decode_steps;
    stats_.decode_tokens += rec.num_tokens;
    stats_.decode_schedule_ns += rec.schedule_ns;
    stats_.decode_build_ns += rec.build_ns;
    stats_.decode_forward_ns += rec.launch_ns + (t1 - t0);
    stats_.decode_update_ns += rec.advance_ns + (now_ns() - t1);
    stats_.decode_sample_ns += step_sample_ns_;
    if (const int64_t dev = executor_.last_step_device_ns(); dev >= 0) {
      stats_.decode_device_ns += dev;
      ++stats_.num_timed_decode_steps;
    }
  }
  inflight_head_ = (inflight_head_ + 1) % static_cast<int>(inflight_.size());
  --num_inflight_;
  return Status::Ok();
}

}  // namespace osprey
