// osprey generate: one prompt (or one chat turn through the model's own chat
// template), the answer streamed to stdout, then a line of timings.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "osprey/engine.h"
#include "osprey/text.h"

namespace osprey::cli {

namespace {

struct GenerateOptions {
  EngineOptions engine;
  std::string prompt;
  std::string system;
  bool chat = false;
  int max_tokens = 128;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  int64_t seed = -1;  // the request's sampling seed
  bool ignore_eos = false;
  bool quiet_timings = false;
  std::string prompt_ids;  // comma-separated token ids instead of --prompt
};

// "1,2, 3" -> {1, 2, 3}; false on anything else.
bool parse_ids(const std::string& text, std::vector<int32_t>& out) {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',')) ++i;
    if (i == text.size()) break;
    size_t end = i;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end == i || end - i > 9) return false;
    out.push_back(static_cast<int32_t>(std::stol(text.substr(i, end - i))));
    i = end;
  }
  return !out.empty();
}

int run_generate(const GenerateOptions& o, const EngineConfigSink& dry_run) {
  if (o.prompt.empty() == o.prompt_ids.empty()) {
    std::fprintf(stderr, "osprey: give exactly one of --prompt and --prompt-ids\n");
    return 1;
  }
  std::vector<int32_t> ids;
  if (!o.prompt_ids.empty() && !parse_ids(o.prompt_ids, ids)) {
    std::fprintf(stderr, "osprey: --prompt-ids must be comma-separated token ids, got '%s'\n", o.prompt_ids.c_str());
    return 1;
  }
  if (!ids.empty() && o.chat) {
    std::fprintf(stderr, "osprey: --chat takes --prompt text, not --prompt-ids\n");
    return 1;
  }
  auto config = resolve_engine_config(o.engine);
  if (!config.ok()) {
    std::fprintf(stderr, "osprey: %s\n", config.status().to_string().c_str());
    return 1;
  }
  if (dry_run) {
    dry_run(*config);
    return 0;
  }
  auto engine = Engine::create(*config);
  if (!engine.ok()) {
    std::fprintf(stderr, "osprey: %s\n", engine.status().to_string().c_str());
    return 1;
  }

  Request req;
  req.params.max_tokens = o.max_tokens;
  req.params.temperature = o.temperature;
  req.params.top_p = o.top_p;
  req.params.top_k = o.top_k;
  req.params.ignore_eos = o.ignore_eos;
  if (o.seed >= 0) req.params.seed = static_cast<uint64_t>(o.seed);
  if (!ids.empty()) {
    req.prompt_token_ids = ids;
  } else if (o.chat) {
    std::shared_ptr<const TextProcessor> text = (*engine)->text();
    if (!text) {
      std::fprintf(stderr, "osprey: this model has no tokenizer or chat template (give --tokenizer)\n");
      return 1;
    }
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
    messages.push_back({{"role", "user"}, {"content", o.prompt}});
    auto rendered = text->apply_chat_template(messages, nullptr, true, nlohmann::ordered_json::object());
    if (!rendered.ok()) {
      std::fprintf(stderr, "osprey: %s\n", rendered.status().to_string().c_str());
      return 1;
    }
    req.prompt = *rendered;
    req.add_special_tokens = false;  // the template already placed them (as transformers does)
  } else {
    req.prompt = o.prompt;
  }

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto stream = (*engine)->submit(std::move(req));
  if (!stream.ok()) {
    std::fprintf(stderr, "osprey: %s\n", stream.status().to_string().c_str());
    return 1;
  }
  Clock::time_point first_token;
  bool have_first = false;
  Usage usage;
  FinishReason finish = FinishReason::kNone;
  Status error;
  while (auto out = (*stream)->next()) {
    for (const CompletionOutput& c : out->outputs) {
      if (!have_first && !c.token_ids.empty()) {
        first_token = Clock::now();
        have_first = true;
      }
      std::fwrite(c.text.data(), 1, c.text.size(), stdout);
      std::fflush(stdout);
      if (c.finish_reason != FinishReason::kNone) finish = c.finish_reason;
    }
    usage = out->usage;
    if (out->finished) error = out->error;
  }
  const auto end = Clock::now();
  std::printf("\n");
  std::fflush(stdout);  // the answer ends before the timings line on stderr
  if (!error.ok()) {
    std::fprintf(stderr, "osprey: %s\n", error.to_string().c_str());
    return 1;
  }
  if (!o.quiet_timings) {
    const double ttft = std::chrono::duration<double>(first_token - start).count();
    const double decode = std::chrono::duration<double>(end - first_token).count();
    const int decoded = usage.completion_tokens - 1;
    std::fprintf(stderr,
                 "[osprey] prompt %d tokens in %.3f s (%.1f tokens/s) | decode %d tokens in %.3f s (%.1f tokens/s) | "
                 "finish: %s\n",
                 usage.prompt_tokens, ttft, ttft > 0 ? usage.prompt_tokens / ttft : 0.0, decoded, decode,
                 decode > 0 && decoded > 0 ? decoded / decode : 0.0, finish_reason_name(finish));
  }
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, EngineConfigSink dry_run) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt, streamed to stdout");
  add_engine_options(cmd, &o->engine);
  cmd->add_option("--prompt", o->prompt, "Prompt text (the user message with --chat)");
  cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt as comma-separated token ids (instead of --prompt)");
  cmd->add_flag("--chat", o->chat, "Send the prompt as a chat message through the model's chat template");
  cmd->add_option("--system", o->system, "System message (with --chat)");
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate at most")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0 = greedy)")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling probability mass")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--top-k", o->top_k, "Sample among the k most likely tokens (0 = off)");
  cmd->add_option("--seed", o->seed, "Random seed of the request (default: random)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past the end-of-sequence token");
  cmd->add_flag("--no-timings", o->quiet_timings, "Do not print the timings line");
  cmd->callback([o, dry_run] { exit_code() = run_generate(*o, dry_run); });
}

}  // namespace osprey::cli
