#include "plan/plan_report.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace osprey::plan {

namespace {

using nlohmann::json;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string sprintf_string(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string sprintf_string(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

// Seconds as "12.3 ms" / "1.23 s" / "45.6 us" with three significant digits.
std::string time_str(double s) {
  if (!std::isfinite(s)) return "-";
  const double ms = s * 1e3;
  auto three = [](double x, const char* unit) {
    if (x >= 100) return sprintf_string("%.0f %s", x, unit);
    if (x >= 10) return sprintf_string("%.1f %s", x, unit);
    return sprintf_string("%.2f %s", x, unit);
  };
  if (ms >= 1000) return three(s, "s");
  if (ms >= 1) return three(ms, "ms");
  return three(ms * 1e3, "us");
}

std::string gib_str(double bytes) {
  return sprintf_string("%.2f GiB", bytes / kGiB);
}

// "14.57 TFLOP", "101.18 MB", "512 FLOP": decimal prefixes.
std::string count_str(double x, const char* unit) {
  if (x >= 1e12) return sprintf_string("%.2f T%s", x / 1e12, unit);
  if (x >= 1e9) return sprintf_string("%.2f G%s", x / 1e9, unit);
  if (x >= 1e6) return sprintf_string("%.2f M%s", x / 1e6, unit);
  if (x >= 1e3) return sprintf_string("%.2f k%s", x / 1e3, unit);
  return sprintf_string("%.0f %s", x, unit);
}

std::string params_str(int64_t n) {
  const double x = static_cast<double>(n);
  return x >= 1e9 ? sprintf_string("%.2f B parameters", x / 1e9) : sprintf_string("%.1f M parameters", x / 1e6);
}

std::string rate_str(double tok_s) {
  if (tok_s >= 100) return sprintf_string("%.0f", tok_s);
  if (tok_s >= 10) return sprintf_string("%.1f", tok_s);
  return sprintf_string("%.2f", tok_s);
}

std::string money_str(double dollars) {
  if (dollars <= 0) return "-";
  if (dollars >= 10) return sprintf_string("$%.1f", dollars);
  if (dollars >= 0.1) return sprintf_string("$%.3f", dollars);
  return sprintf_string("$%.4f", dollars);
}

std::string crossover_str(const std::optional<double>& b) {
  if (!b) return "none";
  return sprintf_string("%.0f", std::ceil(*b));
}

std::string bound_str(const Roofline& r) {
  return r.compute_bound ? "compute" : "memory";
}

std::string gpu_line(const GpuSpec& g) {
  std::string s =
      sprintf_string("%.0f GiB, %.0f GB/s, %.1f TFLOP/s bf16/fp16", g.memory_gib, g.bandwidth_gbs, g.tflops_16);
  s += g.tflops_fp8 > 0 ? sprintf_string(", %.1f fp8", g.tflops_fp8) : ", no fp8";
  s += g.tops_int8 > 0 ? sprintf_string(", %.1f TOP/s int8", g.tops_int8) : ", no int8";
  if (g.link_gbs > 0) s += sprintf_string(", %s %.0f GB/s per direction", g.link.c_str(), g.link_gbs);
  return s;
}

json roofline_json(const Roofline& r) {
  return {{"time_s", r.time_s},
          {"compute_s", r.compute_s},
          {"memory_s", r.memory_s},
          {"allreduce_s", r.comm_s},
          {"bound", bound_str(r)}};
}

json optional_json(const std::optional<double>& x) {
  return x ? json(*x) : json(nullptr);
}

json plan_json(const PlanResult& p) {
  const ModelShape& m = p.model;
  const GpuSpec& g = p.gpu;
  const PlanOptions& o = p.options;
  json j;
  j["model"] = {{"source", m.source},
                {"architecture", m.architecture},
                {"layers", m.num_layers},
                {"hidden", m.hidden_size},
                {"heads", m.num_heads},
                {"kv_heads", m.num_kv_heads},
                {"head_dim", m.head_dim},
                {"intermediate", m.intermediate_size},
                {"vocab", m.vocab_size},
                {"tied_embeddings", m.tie_word_embeddings},
                {"sliding_window", m.sliding_window},
                {"max_context", m.max_position_embeddings},
                {"parameters", p.params_total},
                {"parameters_layers", p.params_layers},
                {"parameters_embedding", p.params_embedding}};
  j["gpu"] = {{"key", g.key},
              {"name", g.name},
              {"memory_gib", g.memory_gib},
              {"bandwidth_gbs", g.bandwidth_gbs},
              {"tflops_bf16", g.tflops_16},
              {"tflops_fp8", g.tflops_fp8},
              {"tops_int8", g.tops_int8},
              {"bf16", g.bf16},
              {"link", g.link},
              {"link_gbs", g.link_gbs},
              {"link_latency_us", g.link_latency_us},
              {"approximate", g.approximate}};
  j["options"] = {{"tp", o.tp},
                  {"dtype", p.dtype},
                  {"head_dtype", p.head_dtype},
                  {"layer_bits", p.layer_bits},
                  {"head_bits", p.head_bits},
                  {"kv_dtype", p.kv_dtype},
                  {"kv_bytes", p.kv_bytes},
                  {"context", p.context},
                  {"prompt_len", o.prompt_len},
                  {"price_per_hour", o.price_per_hour},
                  {"gpu_memory_utilization", o.gpu_memory_utilization},
                  {"mbu", o.mbu},
                  {"mfu", o.mfu},
                  {"max_batched_tokens", o.max_batched_tokens},
                  {"overhead_gib", o.overhead_gib},
                  {"block_size", o.block_size}};
  j["memory"] = {{"usable_bytes", p.usable_bytes},
                 {"weight_bytes_total", p.weight_bytes_total},
                 {"weight_bytes_per_gpu", p.weight_bytes_per_gpu},
                 {"weight_read_bytes_per_gpu", p.weight_read_bytes_per_gpu},
                 {"activation_bytes", p.activation_bytes},
                 {"reserve_bytes", p.reserve_bytes},
                 {"kv_budget_bytes", p.kv_budget_bytes},
                 {"kv_bytes_per_token_total", p.kv_bytes_per_token_total},
                 {"kv_bytes_per_token_per_gpu", p.kv_bytes_per_token_per_gpu},
                 {"kv_heads_per_gpu", p.kv_heads_per_gpu},
                 {"kv_tokens", p.kv_tokens},
                 {"context_kv", p.context_kv},
                 {"max_batch", p.max_batch},
                 {"fits", p.fits},
                 {"fit_problem", p.fit_problem}};
  j["prefill"] = {{"prompt_len", o.prompt_len},
                  {"flops_total", p.prefill_flops_total},
                  {"flops_per_gpu", p.prefill_flops},
                  {"bytes_per_gpu", p.prefill_bytes},
                  {"ttft_sol", roofline_json(p.ttft_sol)},
                  {"ttft_expected", roofline_json(p.ttft_expected)}};
  json decode = json::array();
  for (const DecodePoint& d : p.decode) {
    decode.push_back(
        {{"batch", d.batch},
         {"fits", d.fits},
         {"flops_per_gpu", d.flops},
         {"bytes_per_gpu", d.bytes},
         {"tpot_sol", roofline_json(d.sol)},
         {"tpot_expected", roofline_json(d.expected)},
         {"tokens_per_s_per_gpu_sol", d.tokens_per_s_per_gpu_sol},
         {"tokens_per_s_per_gpu_expected", d.tokens_per_s_per_gpu},
         {"cost_per_million_tokens_sol", d.cost_per_mtok_sol > 0 ? json(d.cost_per_mtok_sol) : json(nullptr)},
         {"cost_per_million_tokens_expected", d.cost_per_mtok > 0 ? json(d.cost_per_mtok) : json(nullptr)}});
  }
  j["decode"] = decode;
  j["crossover_batch"] = {{"at_context_sol", optional_json(p.crossover_sol)},
                          {"at_context_expected", optional_json(p.crossover_expected)},
                          {"weights_only_sol", optional_json(p.crossover_weights_only_sol)},
                          {"weights_only_expected", optional_json(p.crossover_weights_only_expected)}};
  j["notes"] = p.notes;
  return j;
}

std::string format_head(const PlanResult& p) {
  const ModelShape& m = p.model;
  std::string out;
  out += sprintf_string(
      "model    %s (%s): %d layers, hidden %d, %d heads / %d KV heads x %d, ffn %d, vocab %d%s, %s, "
      "context %d%s\n",
      m.source.c_str(), m.architecture.c_str(), m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim,
      m.intermediate_size, m.vocab_size, m.tie_word_embeddings ? " (tied)" : "", params_str(p.params_total).c_str(),
      m.max_position_embeddings,
      m.sliding_window > 0 ? sprintf_string(", sliding window %d", m.sliding_window).c_str() : "");
  return out;
}

}  // namespace

std::string format_text(const PlanResult& p) {
  const PlanOptions& o = p.options;
  std::string out = sprintf_string("osprey plan: %s on %s, tp %d\n", p.model.source.c_str(), p.gpu.name.c_str(), o.tp);
  out += format_head(p);
  out += "gpu      " + gpu_line(p.gpu) + "\n";
  out +=
      sprintf_string("formats  weights %s (layers %.3g bits, embedding/lm_head %s %.3g bits), KV %s (%g B)\n",
                     p.dtype.c_str(), p.layer_bits, p.head_dtype.c_str(), p.head_bits, p.kv_dtype.c_str(), p.kv_bytes);
  for (const std::string& n : p.notes) out += "note     " + n + "\n";

  out += "\nmemory per GPU\n";
  out += sprintf_string("  usable (%.2f x %.0f GiB)            %s\n", o.gpu_memory_utilization, p.gpu.memory_gib,
                        gib_str(p.usable_bytes).c_str());
  out += sprintf_string("  weights                            %s  (whole model %.2f GB)\n",
                        gib_str(p.weight_bytes_per_gpu).c_str(), p.weight_bytes_total / 1e9);
  out +=
      sprintf_string("  reserve                            %s  (%.2f GiB fixed + activations of a %lld-token step)\n",
                     gib_str(p.reserve_bytes).c_str(), o.overhead_gib, static_cast<long long>(o.max_batched_tokens));
  out += sprintf_string("  KV cache budget                    %s\n", gib_str(std::max(0.0, p.kv_budget_bytes)).c_str());
  out += sprintf_string("  KV per token                       %.1f KiB  (%d layers x 2 x %d KV heads x %d x %g B)\n",
                        p.kv_bytes_per_token_per_gpu / 1024, p.model.num_layers, p.kv_heads_per_gpu, p.model.head_dim,
                        p.kv_bytes);
  out += sprintf_string("  KV tokens that fit                 %lld  (pages of %lld)\n",
                        static_cast<long long>(p.kv_tokens), static_cast<long long>(o.block_size));
  out += sprintf_string(
      "  largest batch at context %-9lld %lld%s\n", static_cast<long long>(p.context),
      static_cast<long long>(p.max_batch),
      p.context_kv < p.context
          ? sprintf_string("  (window: %lld KV tokens per sequence)", static_cast<long long>(p.context_kv)).c_str()
          : "");
  if (!p.fits) out += "  DOES NOT FIT: " + p.fit_problem + "\n";

  out += sprintf_string("\nprefill: one prompt of %lld tokens (%s, %s read per GPU)\n",
                        static_cast<long long>(o.prompt_len), count_str(p.prefill_flops, "FLOP").c_str(),
                        count_str(p.prefill_bytes, "B").c_str());
  out += sprintf_string("                 speed of light   expected (mfu %.2f, mbu %.2f)\n", o.mfu, o.mbu);
  out += sprintf_string("  TTFT           %-16s %-16s %s-bound\n", time_str(p.ttft_sol.time_s).c_str(),
                        time_str(p.ttft_expected.time_s).c_str(), bound_str(p.ttft_sol).c_str());
  out += sprintf_string("    compute      %-16s %s\n", time_str(p.ttft_sol.compute_s).c_str(),
                        time_str(p.ttft_expected.compute_s).c_str());
  out += sprintf_string("    memory       %-16s %s\n", time_str(p.ttft_sol.memory_s).c_str(),
                        time_str(p.ttft_expected.memory_s).c_str());
  if (o.tp > 1) out += sprintf_string("    all-reduce   %s\n", time_str(p.ttft_sol.comm_s).c_str());

  out += sprintf_string("\ndecode at context %lld (every sequence reads %lld tokens of KV per step)\n",
                        static_cast<long long>(p.context), static_cast<long long>(p.context_kv));
  out += "  batch   TPOT sol    TPOT exp    bound     tok/s/GPU sol  tok/s/GPU exp";
  if (o.price_per_hour > 0) out += "  $/M tok sol  $/M tok exp";
  if (o.tp > 1) out += "  all-reduce";
  out += "\n";
  for (const DecodePoint& d : p.decode) {
    out +=
        sprintf_string("  %5lld%s  %-10s  %-10s  %-8s  %13s  %13s", static_cast<long long>(d.batch), d.fits ? " " : "*",
                       time_str(d.sol.time_s).c_str(), time_str(d.expected.time_s).c_str(), bound_str(d.sol).c_str(),
                       rate_str(d.tokens_per_s_per_gpu_sol).c_str(), rate_str(d.tokens_per_s_per_gpu).c_str());
    if (o.price_per_hour > 0) {
      out += sprintf_string("  %11s  %11s", money_str(d.cost_per_mtok_sol).c_str(), money_str(d.cost_per_mtok).c_str());
    }
    if (o.tp > 1) out += sprintf_string("  %s", time_str(d.sol.comm_s).c_str());
    out += "\n";
  }
  bool any_over = false;
  for (const DecodePoint& d : p.decode) any_over = any_over || !d.fits;
  if (any_over) out += "  * exceeds the KV cache at this context\n";
  out += sprintf_string(
      "  crossover batch (compute = memory): at context %lld: %s sol, %s expected; weights only: %s sol, "
      "%s expected\n",
      static_cast<long long>(p.context), crossover_str(p.crossover_sol).c_str(),
      crossover_str(p.crossover_expected).c_str(), crossover_str(p.crossover_weights_only_sol).c_str(),
      crossover_str(p.crossover_weights_only_expected).c_str());
  if (!p.crossover_sol) {
    out += "  (none: each sequence's KV read costs more time than its FLOPs, so decode stays memory-bound)\n";
  }
  return out;
}

std::string format_compare_text(const std::string& field, const std::vector<CompareColumn>& columns) {
  std::vector<std::string> labels;
  std::vector<std::vector<std::string>> cells;  // per row, per column
  auto row = [&](const std::string& label, auto value_of) {
    labels.push_back(label);
    std::vector<std::string> r;
    for (const CompareColumn& c : columns) r.push_back(c.plan ? value_of(*c.plan) : std::string("-"));
    cells.push_back(std::move(r));
  };
  const PlanResult* first = nullptr;
  for (const CompareColumn& c : columns) {
    if (c.plan && !first) first = &*c.plan;
  }
  std::string out = "osprey plan --compare " + field + "\n";
  if (first) out += format_head(*first);
  labels.push_back(field);
  {
    std::vector<std::string> r;
    for (const CompareColumn& c : columns) r.push_back(c.value);
    cells.push_back(std::move(r));
  }
  if (field != "gpu") row("gpu", [](const PlanResult& p) { return p.gpu.key; });
  row("weights / KV dtype", [](const PlanResult& p) { return p.dtype + " / " + p.kv_dtype; });
  if (field != "tp") row("tp", [](const PlanResult& p) { return std::to_string(p.options.tp); });
  row("weights per GPU", [](const PlanResult& p) { return gib_str(p.weight_bytes_per_gpu); });
  row("KV budget per GPU", [](const PlanResult& p) { return gib_str(std::max(0.0, p.kv_budget_bytes)); });
  row("KV per token per GPU",
      [](const PlanResult& p) { return sprintf_string("%.1f KiB", p.kv_bytes_per_token_per_gpu / 1024); });
  row("KV tokens", [](const PlanResult& p) { return std::to_string(p.kv_tokens); });
  row("fits", [](const PlanResult& p) { return p.fits ? std::string("yes") : std::string("NO"); });
  if (first) {
    row("max batch @ " + std::to_string(first->context),
        [](const PlanResult& p) { return std::to_string(p.max_batch); });
    row("TTFT " + std::to_string(first->options.prompt_len) + " sol / exp",
        [](const PlanResult& p) { return time_str(p.ttft_sol.time_s) + " / " + time_str(p.ttft_expected.time_s); });
    for (int64_t b : first->options.batches) {
      auto find = [b](const PlanResult& p) -> const DecodePoint* {
        for (const DecodePoint& d : p.decode)
          if (d.batch == b) return &d;
        return nullptr;
      };
      row("TPOT b=" + std::to_string(b) + " sol / exp", [&](const PlanResult& p) {
        const DecodePoint* d = find(p);
        if (!d) return std::string("-");
        return time_str(d->sol.time_s) + " / " + time_str(d->expected.time_s) + (d->fits ? "" : " *");
      });
      row("tok/s/GPU b=" + std::to_string(b) + " exp", [&](const PlanResult& p) {
        const DecodePoint* d = find(p);
        return d ? rate_str(d->tokens_per_s_per_gpu) : std::string("-");
      });
      if (first->options.price_per_hour > 0) {
        row("$/M tok b=" + std::to_string(b) + " exp", [&](const PlanResult& p) {
          const DecodePoint* d = find(p);
          return d ? money_str(d->cost_per_mtok) : std::string("-");
        });
      }
    }
    row("crossover batch sol / exp", [](const PlanResult& p) {
      return crossover_str(p.crossover_sol) + " / " + crossover_str(p.crossover_expected);
    });
    row("crossover weights only", [](const PlanResult& p) {
      return crossover_str(p.crossover_weights_only_sol) + " / " + crossover_str(p.crossover_weights_only_expected);
    });
  }
  size_t label_width = 0;
  for (const std::string& l : labels) label_width = std::max(label_width, l.size());
  std::vector<size_t> widths(columns.size(), 0);
  for (const auto& r : cells)
    for (size_t c = 0; c < r.size(); ++c) widths[c] = std::max(widths[c], r[c].size());
  for (size_t i = 0; i < labels.size(); ++i) {
    out += "  " + labels[i] + std::string(label_width - labels[i].size(), ' ');
    for (size_t c = 0; c < columns.size(); ++c) {
      out += "  " + std::string(widths[c] - cells[i][c].size(), ' ') + cells[i][c];
    }
    out += "\n";
  }
  bool starred = false;
  for (const CompareColumn& c : columns) {
    if (!c.plan) out += "  " + c.value + ": " + c.error + "\n";
    if (c.plan) {
      for (const DecodePoint& d : c.plan->decode) starred = starred || !d.fits;
      for (const std::string& n : c.plan->notes) out += "  note (" + c.value + "): " + n + "\n";
      if (!c.plan->fits) out += "  " + c.value + " does not fit: " + c.plan->fit_problem + "\n";
    }
  }
  if (starred) out += "  * exceeds the KV cache at this context\n";
  return out;
}

std::string format_json(const PlanResult& p) {
  return plan_json(p).dump(2) + "\n";
}

std::string format_compare_json(const std::string& field, const std::vector<CompareColumn>& columns) {
  json j;
  j["compare"] = field;
  json plans = json::array();
  for (const CompareColumn& c : columns) {
    json e = c.plan ? plan_json(*c.plan) : json::object();
    e["value"] = c.value;
    if (!c.plan) e["error"] = c.error;
    plans.push_back(std::move(e));
  }
  j["plans"] = std::move(plans);
  return j.dump(2) + "\n";
}

}  // namespace osprey::plan
