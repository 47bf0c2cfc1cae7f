// osprey perplexity: a model's perplexity over a text file, from the engine's
// prompt logprobs (tools/perplexity.h: windows, scoring, statistics), with
// --save / --compare to measure what a setting (FP8 KV pages, FP8 weights,
// bf16 compute...) costs against another run over the same tokens.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "osprey/engine.h"
#include "perplexity.h"

namespace osprey::cli {

namespace {

constexpr size_t kMaxTextBytes = size_t{256} << 20;
// Prompt-logprob rows per engine step: the scheduler gives prompts that ask
// for logprobs at most this many tokens a step, and each row is a logits row
// on the host (vocab floats).
constexpr int kMaxLogitRows = 1024;

struct PerplexityOptions {
  EngineOptions engine;
  std::string file;
  int ctx = 512;
  int score_from = -1;  // -1: ctx / 2
  int max_windows = 0;  // 0: all
  bool no_bos = false;
  std::string save;
  std::string compare_with;
  bool json = false;
};

Expected<std::string> read_file(const std::string& path, const char* what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return not_found(std::string("cannot open ") + what + " '" + path + "'");
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxTextBytes) {
    return invalid_argument(std::string(what) + " '" + path + "' is unreadable or larger than " +
                            std::to_string(kMaxTextBytes >> 20) + " MiB");
  }
  std::ifstream in(path, std::ios::binary);
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (!in || static_cast<uintmax_t>(in.gcount()) != size) {
    return not_found(std::string("cannot open ") + what + " '" + path + "'");
  }
  return text;
}

// s with "--compare 'FILE': " before its message.
Status about_compare_file(const std::string& file, const Status& s) {
  return Status(s.code(), "--compare '" + file + "': " + s.message());
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return not_found("cannot write '" + path + "'");
  out << text;
  out.close();
  if (!out) return internal_error("writing '" + path + "' failed");
  return Status::Ok();
}

// Whether `path` can be written (its folder exists and is writable, and
// the file, where it exists, is too): checked before a run that may last
// long, so that its results are not lost to a mistyped --save path.
Status check_writable(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0 ||
      (fs::exists(p, ec) && (fs::is_directory(p, ec) || ::access(p.c_str(), W_OK) != 0))) {
    return invalid_argument("cannot write --save file '" + path + "'");
  }
  return Status::Ok();
}

int fail(const Status& s) {
  std::fprintf(stderr, "osprey: %s\n", s.to_string().c_str());
  return 1;
}

int run_perplexity(const PerplexityOptions& o, const EngineConfigSink& dry_run) {
  if (o.file.empty()) return fail(invalid_argument("--file is required"));
  auto config = resolve_engine_config(o.engine);
  if (!config.ok()) return fail(config.status());
  // Every scored position must be computed, not taken from the prefix cache.
  config->enable_prefix_caching = false;
  config->max_prompt_logprob_rows = std::max(1, std::min(config->max_num_batched_tokens, kMaxLogitRows));
  if (dry_run) {
    dry_run(*config);
    return 0;
  }
  // Read the inputs before loading the model, so that a bad path fails fast.
  auto text = read_file(o.file, "--file");
  if (!text.ok()) return fail(text.status());
  if (!o.save.empty()) {
    const Status s = check_writable(o.save);
    if (!s.ok()) return fail(s);
  }
  std::vector<ScoredToken> base;
  if (!o.compare_with.empty()) {
    auto saved = read_file(o.compare_with, "--compare file");
    if (!saved.ok()) return fail(saved.status());
    auto parsed = scores_from_json(*saved);
    if (!parsed.ok()) return fail(about_compare_file(o.compare_with, parsed.status()));
    base = std::move(*parsed);
  }

  auto engine = Engine::create(*config);
  if (!engine.ok()) return fail(engine.status());
  auto ids = (*engine)->encode(*text, /*add_special_tokens=*/false);
  if (!ids.ok()) return fail(ids.status());
  std::vector<int32_t> prefix;
  if (!o.no_bos) {
    auto specials = (*engine)->encode("", /*add_special_tokens=*/true);
    if (!specials.ok()) return fail(specials.status());
    prefix = std::move(*specials);
  }
  const int max_len = (*engine)->model_info().max_model_len;
  if (o.ctx + 1 > max_len) {
    return fail(invalid_argument("--ctx " + std::to_string(o.ctx) + " needs a context of " +
                                 std::to_string(o.ctx + 1) + " tokens; the engine's is " + std::to_string(max_len) +
                                 " (--max-model-len)"));
  }
  auto plan = plan_perplexity(ids->size(), o.ctx, o.score_from, std::move(prefix), o.max_windows);
  if (!plan.ok()) return fail(plan.status());

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::vector<std::vector<int32_t>> windows(static_cast<size_t>(plan->num_windows));
  std::vector<std::shared_ptr<RequestStream>> streams;
  streams.reserve(windows.size());
  for (int w = 0; w < plan->num_windows; ++w) {
    windows[w] = window_tokens(*plan, *ids, w);
    Request req;
    req.request_id = "ppl-" + std::to_string(w);
    req.prompt_token_ids = windows[w];
    req.params.max_tokens = 1;
    req.params.temperature = 0.0f;
    req.params.ignore_eos = true;
    req.params.prompt_logprobs = 1;  // the token's logprob and the most likely token
    auto s = (*engine)->submit(std::move(req));
    if (!s.ok()) return fail(s.status());
    streams.push_back(*s);
  }
  auto last_report = Clock::now();
  std::vector<ScoredToken> scored;
  scored.reserve(static_cast<size_t>(plan->num_windows) * static_cast<size_t>(plan->ctx - plan->score_from));
  for (int w = 0; w < plan->num_windows; ++w) {
    std::vector<TokenLogprob> lps;
    Status error;
    while (auto out = streams[w]->next()) {
      if (!out->prompt_logprobs.empty()) lps = std::move(out->prompt_logprobs);
      if (out->finished) error = out->error;
    }
    if (!error.ok()) return fail(error);
    const std::vector<int32_t>& win = windows[w];
    if (lps.size() != win.size()) {
      return fail(internal_error("window " + std::to_string(w) + ": " + std::to_string(lps.size()) +
                                 " prompt logprobs for " + std::to_string(win.size()) + " tokens"));
    }
    for (int p = plan->score_from; p < plan->ctx; ++p) {
      const TokenLogprob& lp = lps[p];
      if (lp.token_id != win[p] || lp.top.empty()) {
        return fail(internal_error("window " + std::to_string(w) + " position " + std::to_string(p) +
                                   ": the prompt logprob is not of the window's token"));
      }
      scored.push_back({win[p], -static_cast<double>(lp.logprob), lp.top.front().token_id});
    }
    // Long runs show their progress on stderr, at most every 5 seconds.
    const auto now = Clock::now();
    if (w + 1 < plan->num_windows && now - last_report >= std::chrono::seconds(5)) {
      last_report = now;
      std::fprintf(stderr, "[osprey] %d of %d windows, perplexity so far %.4f\n", w + 1, plan->num_windows,
                   summarize(scored).ppl);
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t computed = int64_t{plan->num_windows} * plan->ctx;

  const PerplexityStats st = summarize(scored);
  std::optional<PerplexityComparison> cmp;
  if (!o.compare_with.empty()) {
    auto c = compare(scored, base);
    if (!c.ok()) return fail(about_compare_file(o.compare_with, c.status()));
    cmp = *c;
  }
  if (!o.save.empty()) {
    const Status s = write_file(o.save, scores_to_json(*plan, scored));
    if (!s.ok()) return fail(s);
  }

  if (o.json) {
    nlohmann::ordered_json j;
    j["model"] = config->model_path;
    j["file"] = o.file;
    j["ctx"] = plan->ctx;
    j["score_from"] = plan->score_from;
    j["prefix"] = plan->prefix;
    j["windows"] = plan->num_windows;
    j["text_tokens"] = ids->size();
    j["scored_tokens"] = st.count;
    j["ppl"] = st.ppl;
    j["ppl_err"] = st.ppl_err;
    j["mean_nll"] = st.mean_nll;
    j["stderr_nll"] = st.stderr_nll;
    j["top1"] = st.top1;
    j["seconds"] = seconds;
    j["tokens_per_s"] = seconds > 0 ? static_cast<double>(computed) / seconds : 0.0;
    if (cmp) {
      j["compare"] = {{"file", o.compare_with},         {"ppl_ratio", cmp->ppl_ratio},
                      {"mean_dnll", cmp->mean_dnll},     {"stderr_dnll", cmp->stderr_dnll},
                      {"mean_abs_dnll", cmp->mean_abs_dnll}, {"same_top1", cmp->same_top1}};
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("perplexity %.4f +/- %.4f over %lld tokens (%d windows of %d tokens, scored from position %d)\n", st.ppl,
              st.ppl_err, static_cast<long long>(st.count), plan->num_windows, plan->ctx, plan->score_from);
  std::printf("mean NLL %.5f +/- %.5f nats, top-1 accuracy %.2f%%\n", st.mean_nll, st.stderr_nll, 100.0 * st.top1);
  if (cmp) {
    std::printf(
        "against %s: perplexity ratio %.5f (mean NLL difference %+.5f +/- %.5f nats), mean |NLL difference| %.5f, "
        "same top-1 token %.2f%%\n",
        o.compare_with.c_str(), cmp->ppl_ratio, cmp->mean_dnll, cmp->stderr_dnll, cmp->mean_abs_dnll,
        100.0 * cmp->same_top1);
  }
  std::fflush(stdout);
  std::fprintf(stderr, "[osprey] %lld prompt tokens in %.2f s (%.1f tokens/s)\n", static_cast<long long>(computed),
               seconds, seconds > 0 ? static_cast<double>(computed) / seconds : 0.0);
  return 0;
}

}  // namespace

void add_perplexity_command(CLI::App& app, EngineConfigSink dry_run) {
  auto o = std::make_shared<PerplexityOptions>();
  auto* cmd = app.add_subcommand(
      "perplexity", "Perplexity of the model over a text file (windows of --ctx tokens, the second half of each scored)");
  add_engine_options(cmd, &o->engine);
  cmd->add_option("--file", o->file, "UTF-8 text to score")->required();
  cmd->add_option("--ctx", o->ctx, "Tokens per window (the tokenizer's BOS included)")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--score-from", o->score_from,
                  "First scored position in each window (default: ctx / 2, so every scored token has that much "
                  "context)");
  cmd->add_option("--max-windows", o->max_windows, "Score at most this many windows (0: every whole window)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--no-bos", o->no_bos, "Do not start each window with the tokens the tokenizer adds (BOS)");
  cmd->add_option("--save", o->save, "Write every scored token's NLL and most likely token to this JSON file");
  cmd->add_option("--compare", o->compare_with,
                  "A file written by --save from another run over the same text: print the paired differences");
  cmd->add_flag("--json", o->json, "Print the results as one JSON object");
  cmd->callback([o, dry_run] { exit_code() = run_perplexity(*o, dry_run); });
}

}  // namespace osprey::cli
