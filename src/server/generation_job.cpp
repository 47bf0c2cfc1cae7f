#include "server/generation_job.h"

#include <spdlog/spdlog.h>

#include "server/json_util.h"

namespace osprey::server {

using json = nlohmann::ordered_json;

GenerationJob::GenerationJob(GenerationRequest request, std::vector<Prompt> prompts, ResponseMeta meta,
                             std::shared_ptr<ResponseWriter> writer, std::shared_ptr<GenerationBackend> backend,
                             std::shared_ptr<ServerMetrics> metrics, Clock::time_point arrival)
    : req_(std::move(request)),
      prompts_(std::move(prompts)),
      meta_(std::move(meta)),
      writer_(std::move(writer)),
      backend_(std::move(backend)),
      metrics_(std::move(metrics)),
      arrival_(arrival) {
  const size_t n = static_cast<size_t>(req_.params.n);
  choices_.resize(prompts_.size() * n);
  subs_.resize(prompts_.size());
  subs_left_ = prompts_.size();
}

std::optional<ApiError> GenerationJob::start() {
  auto self = shared_from_this();
  if (req_.kind == ApiKind::kChat && tool_parser != ToolParserKind::kNone)
    for (Choice& ch : choices_) ch.tools = std::make_unique<ToolCallStream>(tool_parser);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    Request r;
    r.request_id = meta_.id + "-" + std::to_string(i);
    r.prompt_token_ids = prompts_[i].token_ids;
    r.add_special_tokens = false;
    r.params = req_.params;
    subs_[i].engine_id = r.request_id;
    auto stream = backend_->submit(std::move(r), [self, i](const RequestOutput& out) { self->on_output(i, out); });
    if (!stream.ok()) {
      std::unique_lock lock(mu_);
      failed_start_ = true;
      done_ = true;
      dequeue_locked();
      std::vector<std::shared_ptr<RequestStream>> started;
      for (size_t k = 0; k < i; ++k)
        if (subs_[k].stream) started.push_back(subs_[k].stream);
      lock.unlock();
      for (auto& s : started) s->cancel();
      return api_error_from_status(stream.status());
    }
    std::lock_guard lock(mu_);
    subs_[i].stream = std::move(*stream);
  }
  std::unique_lock lock(mu_);
  started_ = true;
  if (req_.stream) {
    writer_->start_stream(200, "text/event-stream; charset=utf-8");
    if (req_.kind == ApiKind::kChat) {
      for (size_t c = 0; c < choices_.size(); ++c)
        emit(chat_chunk(meta_, static_cast<int>(c), {{"role", "assistant"}, {"content", ""}}, nullptr,
                        FinishReason::kNone, req_.include_usage));
    }
  }
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [sub, out] : pending) process_locked(sub, out);
  std::vector<std::shared_ptr<RequestStream>> to_cancel;
  if (cancelled_ && !done_)  // cancelled while submitting
    for (const Sub& s : subs_)
      if (!s.finished && s.stream) to_cancel.push_back(s.stream);
  lock.unlock();
  for (auto& s : to_cancel) s->cancel();
  return std::nullopt;
}

void GenerationJob::cancel() {
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::string> ids;
  {
    std::lock_guard lock(mu_);
    if (done_ || cancelled_) return;
    cancelled_ = true;
    if (!started_) return;  // start() cancels once its submits are done
    for (const Sub& s : subs_) {
      if (s.finished) continue;
      if (s.stream)
        streams.push_back(s.stream);
      else
        ids.push_back(s.engine_id);
    }
  }
  for (auto& s : streams) s->cancel();
  for (auto& id : ids) backend_->cancel(id);
}

void GenerationJob::dequeue_locked() {
  if (dequeued_) return;
  dequeued_ = true;
  if (on_dequeued) on_dequeued();
}

void GenerationJob::emit(const json& chunk) {
  writer_->write(sse_event(chunk));
}

void GenerationJob::on_output(size_t sub, const RequestOutput& out) {
  std::lock_guard lock(mu_);
  if (failed_start_ || done_) return;
  if (!started_) {
    pending_.emplace_back(sub, out);
    return;
  }
  process_locked(sub, out);
}

void GenerationJob::handle_echo(size_t sub, int choice, const RequestOutput& out, std::string& text, json& lp) {
  Choice& ch = choices_[choice];
  ch.echoed = true;
  text = prompts_[sub].echo_text + text;
  if (req_.logprobs) {
    // Prompt logprobs first (the first prompt token has none), then the new tokens'.
    json prompt_lp;
    size_t offset = 0;
    std::vector<TokenLogprob> prompt = out.prompt_logprobs;
    if (prompt.empty()) {
      // The engine gave none: still list the prompt tokens, with null logprobs.
      for (int32_t id : prompts_[sub].token_ids) {
        TokenLogprob t;
        t.token_id = id;
        t.token = backend_->decode(std::span<const int32_t>(&id, 1), false);
        prompt.push_back(std::move(t));
      }
      append_completion_logprobs(prompt_lp, prompt, offset, false);
      for (auto& v : prompt_lp["token_logprobs"]) v = nullptr;
      for (auto& v : prompt_lp["top_logprobs"]) v = nullptr;
    } else {
      append_completion_logprobs(prompt_lp, prompt, offset, true);
    }
    ch.lp_offset = offset;
    lp = std::move(prompt_lp);
  }
}

void GenerationJob::process_locked(size_t sub, const RequestOutput& out) {
  dequeue_locked();
  const auto now = Clock::now();
  const int n = req_.params.n;
  const bool chat = req_.kind == ApiKind::kChat;
  if (out.queue_time_s && !subs_[sub].got_queue_time) {
    // The engine's queue time: submit() to the step that first scheduled the request.
    subs_[sub].got_queue_time = true;
    metrics_->observe_queue_time(*out.queue_time_s);
  }
  for (const CompletionOutput& c : out.outputs) {
    if (c.index < 0 || c.index >= n) continue;
    const int idx = static_cast<int>(sub) * n + c.index;
    Choice& ch = choices_[idx];
    if (!c.token_ids.empty()) {
      if (!ch.seen_token) {
        ch.seen_token = true;
        ch.first_token = now;
        if (!any_token_) {
          any_token_ = true;
          metrics_->observe_ttft(std::chrono::duration<double>(now - arrival_).count());
        }
      } else {
        metrics_->observe_inter_token(std::chrono::duration<double>(now - ch.last_output).count());
      }
      ch.last_output = now;
      ch.num_tokens += static_cast<int>(c.token_ids.size());
    }
    std::string text = c.text;
    json chunk_lp;  // this output's logprobs (streaming), in the API's shape
    if (!chat && req_.echo && !ch.echoed) handle_echo(sub, idx, out, text, req_.stream ? chunk_lp : ch.logprobs);
    if (req_.logprobs) {
      if (chat) {
        json lp = chat_logprobs_json(c.logprobs);
        if (req_.stream) {
          chunk_lp = std::move(lp);
        } else {
          if (ch.logprobs.is_null()) ch.logprobs = {{"content", json::array()}, {"refusal", nullptr}};
          for (auto& e : lp["content"]) ch.logprobs["content"].push_back(std::move(e));
        }
      } else {
        append_completion_logprobs(req_.stream ? chunk_lp : ch.logprobs, c.logprobs, ch.lp_offset);
      }
    }
    if (c.finish_reason != FinishReason::kNone) ch.finish = c.finish_reason;
    std::vector<ToolCall> calls;
    if (ch.tools) {
      // Markup of a call is held back until the call is complete; only plain text goes on.
      ToolParseResult tr = ch.tools->push(text);
      if (c.finish_reason != FinishReason::kNone) {
        ToolParseResult rest = ch.tools->finish();
        tr.content += rest.content;
        for (ToolCall& k : rest.calls) tr.calls.push_back(std::move(k));
      }
      text = std::move(tr.content);
      calls = std::move(tr.calls);
    }
    deliver_locked(idx, text, std::move(calls), chunk_lp, out);
    if (req_.stream && c.finish_reason != FinishReason::kNone) emit(finish_chunk_locked(idx, c.finish_reason, out));
    if (c.finish_reason != FinishReason::kNone) {
      const double e2e = std::chrono::duration<double>(now - arrival_).count();
      const double ttft = ch.seen_token ? std::chrono::duration<double>(ch.first_token - arrival_).count() : -1.0;
      metrics_->observe_finished(c.finish_reason, ch.num_tokens, e2e, ttft);
    }
  }
  if (!out.finished) return;
  Sub& s = subs_[sub];
  if (s.finished) return;
  s.finished = true;
  s.usage = out.usage;
  metrics_->observe_prompt(static_cast<int>(prompts_[sub].token_ids.size()));
  const FinishReason fallback = out.error.ok() ? FinishReason::kAbort : FinishReason::kError;
  for (int k = 0; k < n; ++k) {
    Choice& ch = choices_[sub * n + k];
    if (ch.finish != FinishReason::kNone) continue;
    ch.finish = fallback;
    if (ch.tools) {
      ToolParseResult rest = ch.tools->finish();  // what was held back
      deliver_locked(static_cast<int>(sub) * n + k, rest.content, std::move(rest.calls), nullptr, out);
    }
    const double ttft = ch.seen_token ? std::chrono::duration<double>(ch.first_token - arrival_).count() : -1.0;
    metrics_->observe_finished(fallback, ch.num_tokens, std::chrono::duration<double>(now - arrival_).count(), ttft);
    if (req_.stream) emit(finish_chunk_locked(static_cast<int>(sub) * n + k, fallback, out));
  }
  if (!out.error.ok() && error_.ok()) error_ = out.error;
  if (--subs_left_ == 0) finish_locked();
}

void GenerationJob::deliver_locked(int idx, const std::string& text, std::vector<ToolCall> calls, const json& chunk_lp,
                                   const RequestOutput& out) {
  Choice& ch = choices_[idx];
  const bool chat = req_.kind == ApiKind::kChat;
  if (!req_.stream) {
    ch.text += text;
    for (ToolCall& c : calls) {
      ch.calls.push_back(std::move(c));
      ++ch.num_calls;
    }
    return;
  }
  const bool has_lp = !chunk_lp.is_null() && (chat ? !chunk_lp["content"].empty() : !chunk_lp["tokens"].empty());
  if (!text.empty() || has_lp) {
    json chunk = chat ? chat_chunk(meta_, idx, {{"content", text}}, chunk_lp, FinishReason::kNone, req_.include_usage)
                      : completion_chunk(meta_, idx, text, chunk_lp, FinishReason::kNone, req_.include_usage);
    if (req_.continuous_usage_stats) chunk["usage"] = usage_json(out.usage);
    emit(chunk);
  }
  for (const ToolCall& c : calls) {
    for (json delta : {tool_call_name_delta(ch.num_calls, c), tool_call_arguments_delta(ch.num_calls, c)}) {
      json chunk = chat_chunk(meta_, idx, std::move(delta), nullptr, FinishReason::kNone, req_.include_usage);
      if (req_.continuous_usage_stats) chunk["usage"] = usage_json(out.usage);
      emit(chunk);
    }
    ++ch.num_calls;
  }
}

json GenerationJob::finish_chunk_locked(int idx, FinishReason reason, const RequestOutput& out) {
  const bool chat = req_.kind == ApiKind::kChat;
  json chunk = chat ? chat_chunk(meta_, idx, json::object(), nullptr, reason, req_.include_usage)
                    : completion_chunk(meta_, idx, "", nullptr, reason, req_.include_usage);
  if (chat && reason == FinishReason::kStop && choices_[idx].num_calls > 0)
    chunk["choices"][0]["finish_reason"] = "tool_calls";
  if (req_.continuous_usage_stats) chunk["usage"] = usage_json(out.usage);
  return chunk;
}

Usage GenerationJob::total_usage_locked() const {
  Usage u;
  for (size_t i = 0; i < subs_.size(); ++i) {
    // The prompt length is known exactly here; completion and cached counts come from the engine.
    u.prompt_tokens += static_cast<int>(prompts_[i].token_ids.size());
    u.completion_tokens += subs_[i].usage.completion_tokens;
    u.cached_tokens += subs_[i].usage.cached_tokens;
  }
  return u;
}

void GenerationJob::finish_locked() {
  done_ = true;
  const Usage usage = total_usage_locked();
  const bool chat = req_.kind == ApiKind::kChat;
  int status = 200;
  if (!error_.ok()) {
    ApiError e = api_error_from_status(error_);
    if (e.http_status >= 500) spdlog::error("[{}] generation failed: {}", writer_->request_id(), error_.to_string());
    if (req_.stream) {
      emit(e.to_json());
    } else {
      status = e.http_status;
      HttpResponse r;
      r.status = e.http_status;
      r.body = dump_json(e.to_json());
      writer_->send(std::move(r));
    }
  }
  if (req_.stream) {
    if (req_.include_usage) emit(usage_chunk(meta_, chat, usage));
    writer_->write(kSseDone);
    writer_->finish();
  } else if (error_.ok()) {
    json choices = json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& ch = choices_[i];
      json choice = chat ? chat_choice(static_cast<int>(i), ch.text, ch.logprobs, ch.finish)
                         : completion_choice(static_cast<int>(i), ch.text, ch.logprobs, ch.finish);
      if (!ch.calls.empty()) {
        // OpenAI's shape: content null when the model only called tools.
        choice["message"]["tool_calls"] = tool_calls_json(ch.calls);
        if (ch.text.find_first_not_of(" \t\r\n") == std::string::npos) choice["message"]["content"] = nullptr;
        if (ch.finish == FinishReason::kStop) choice["finish_reason"] = "tool_calls";
      }
      choices.push_back(std::move(choice));
    }
    HttpResponse r;
    r.body = dump_json(chat ? chat_response(meta_, std::move(choices), usage)
                            : completion_response(meta_, std::move(choices), usage));
    writer_->send(std::move(r));
  }
  metrics_->count_http(status);
  if (on_done) on_done(*this);
}

}  // namespace osprey::server
