#include "plan/planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

namespace osprey::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kActivationBytes = 2;  // bf16/fp16 activations
constexpr int64_t kDefaultContext = 4096;

struct FormatRow {
  const char* name;
  double bits;
  ComputeRate rate;
  const char* head_default;
};
// Bits include block scales: q8_0 = 34 bytes / 32, q4_0 = 18 / 32, q4_1 = 20 / 32.
const FormatRow kFormats[] = {
    {"bf16", 16, ComputeRate::k16, "bf16"},  {"fp16", 16, ComputeRate::k16, "fp16"},
    {"fp32", 32, ComputeRate::k16, "fp32"},  {"fp8", 8, ComputeRate::kFp8, "bf16"},
    {"int8", 8, ComputeRate::kInt8, "bf16"}, {"int4", 4, ComputeRate::k16, "bf16"},
    {"q8_0", 8.5, ComputeRate::k16, "q8_0"}, {"q4_0", 4.5, ComputeRate::k16, "q8_0"},
    {"q4_1", 5.0, ComputeRate::k16, "q8_0"},
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string fmt(double x) {
  std::ostringstream o;
  o << x;
  return o.str();
}

Status check_fraction(const char* flag, double v) {
  if (!(std::isfinite(v) && v > 0 && v <= 1))
    return invalid_argument(std::string(flag) + " must be in (0, 1], got " + fmt(v));
  return Status::Ok();
}

double rate_flops(const GpuSpec& g, ComputeRate r) {
  switch (r) {
    case ComputeRate::kFp8:
      return g.tflops_fp8 * 1e12;
    case ComputeRate::kInt8:
      return g.tops_int8 * 1e12;
    case ComputeRate::k16:
      break;
  }
  return g.tflops_16 * 1e12;
}

// Work of one forward, per GPU.
struct Work {
  double matmul_flops = 0;  // at the weight format's rate
  double attn_flops = 0;    // at the 16-bit rate
  double bytes = 0;
  int64_t tokens = 0;  // rows through the layers (all-reduce message size)
};

struct Rates {
  double matmul = 0, attn = 0, bandwidth = 0;  // FLOP/s, FLOP/s, B/s
};

Roofline evaluate(const Work& w, const Rates& r, double efficiency_compute, double efficiency_memory,
                  const PlanResult& p) {
  Roofline out;
  out.compute_s = (w.matmul_flops / r.matmul + w.attn_flops / r.attn) / efficiency_compute;
  out.memory_s = w.bytes / r.bandwidth / efficiency_memory;
  const int tp = p.options.tp;
  if (tp > 1) {
    // Two all-reduces per layer (after o_proj and after down_proj), ring
    // algorithm: each GPU sends and receives 2 (tp - 1) / tp of the message.
    const double message = static_cast<double>(w.tokens) * p.model.hidden_size * kActivationBytes;
    const double one = p.gpu.link_latency_us * 1e-6 + 2.0 * (tp - 1) / tp * message / (p.gpu.link_gbs * 1e9);
    out.comm_s = 2.0 * p.model.num_layers * one;
  }
  out.compute_bound = out.compute_s >= out.memory_s;
  out.time_s = std::max(out.compute_s, out.memory_s) + out.comm_s;
  return out;
}

// Batch where B x (per-token compute time) = weight time + B x (per-sequence KV time).
std::optional<double> crossover(double token_compute_s, double weight_s, double seq_kv_s) {
  const double denom = token_compute_s - seq_kv_s;
  if (!(denom > 0)) return std::nullopt;
  return weight_s / denom;
}

}  // namespace

Expected<WeightFormat> weight_format(const std::string& name) {
  const std::string n = lower(name);
  std::string list;
  for (const FormatRow& f : kFormats) {
    if (n == f.name) return WeightFormat{f.name, f.bits, f.rate, f.head_default};
    list += (list.empty() ? "" : ", ") + std::string(f.name);
  }
  return invalid_argument("unknown weight dtype '" + name + "' (known: " + list + ", file)");
}

Expected<double> kv_dtype_bytes(const std::string& name, int head_dim) {
  const std::string n = lower(name);
  if (n == "bf16" || n == "fp16") return 2.0;
  if (n == "fp8") return 1.0;
  // osprey's int8 pages: a byte a value and an fp32 scale a row of head_dim.
  if (n == "int8") return 1.0 + 4.0 / std::max(1, head_dim);
  if (n == "fp32") return 4.0;
  return invalid_argument("unknown KV dtype '" + name + "' (known: bf16, fp16, fp8, int8, fp32)");
}

double causal_key_count(int64_t n, int64_t window) {
  const double nn = static_cast<double>(n);
  if (window <= 0 || n <= window) return nn * (nn + 1) / 2;
  const double w = static_cast<double>(window);
  return w * (w + 1) / 2 + (nn - w) * w;
}

Expected<PlanResult> make_plan(const ModelShape& model, const GpuSpec& gpu, const PlanOptions& options) {
  PlanResult p;
  p.model = model;
  p.gpu = gpu;
  p.options = options;
  PlanOptions& o = p.options;
  OSP_RETURN_IF_ERROR(validate_gpu(gpu));
  if (model.num_layers <= 0 || model.hidden_size <= 0 || model.num_heads <= 0 || model.num_kv_heads <= 0 ||
      model.head_dim <= 0 || model.vocab_size <= 0 || model.num_parameters <= 0) {
    return invalid_argument("model '" + model.source + "' has a non-positive dimension");
  }

  // ---- options ----
  if (o.tp < 1 || o.tp > 1024) return invalid_argument("--tp must be in [1, 1024], got " + std::to_string(o.tp));
  if (model.num_heads % o.tp != 0) {
    return invalid_argument("--tp " + std::to_string(o.tp) + " does not divide the " + std::to_string(model.num_heads) +
                            " attention heads");
  }
  const bool kv_split = model.num_kv_heads >= o.tp;
  if (kv_split ? model.num_kv_heads % o.tp != 0 : o.tp % model.num_kv_heads != 0) {
    return invalid_argument("--tp " + std::to_string(o.tp) + " and the " + std::to_string(model.num_kv_heads) +
                            " KV heads: one must divide the other");
  }
  if (o.tp > 1 && gpu.link_gbs <= 0) {
    return invalid_argument("--tp " + std::to_string(o.tp) + " needs a link bandwidth for GPU '" + gpu.key +
                            "' (--link-gbs)");
  }
  if (o.context == 0) o.context = std::min<int64_t>(kDefaultContext, model.max_position_embeddings);
  if (o.prompt_len == 0) o.prompt_len = std::min<int64_t>(1024, model.max_position_embeddings);
  if (o.context < 1) return invalid_argument("--context must be positive, got " + std::to_string(o.context));
  if (o.prompt_len < 1) return invalid_argument("--prompt-len must be positive, got " + std::to_string(o.prompt_len));
  if (model.max_position_embeddings > 0) {
    const int64_t max_ctx = model.max_position_embeddings;
    if (o.context > max_ctx) {
      return invalid_argument("--context " + std::to_string(o.context) + " exceeds the model's context length " +
                              std::to_string(max_ctx));
    }
    if (o.prompt_len > max_ctx) {
      return invalid_argument("--prompt-len " + std::to_string(o.prompt_len) + " exceeds the model's context length " +
                              std::to_string(max_ctx));
    }
  }
  if (o.batches.empty()) return invalid_argument("--batch lists no batch size");
  for (int64_t b : o.batches) {
    if (b < 1 || b > (int64_t{1} << 24))
      return invalid_argument("--batch sizes must be in [1, 2^24], got " + std::to_string(b));
  }
  if (!(std::isfinite(o.price_per_hour) && o.price_per_hour >= 0)) {
    return invalid_argument("--price-per-hour must be >= 0, got " + fmt(o.price_per_hour));
  }
  OSP_RETURN_IF_ERROR(check_fraction("--gpu-memory-utilization", o.gpu_memory_utilization));
  OSP_RETURN_IF_ERROR(check_fraction("--mbu", o.mbu));
  OSP_RETURN_IF_ERROR(check_fraction("--mfu", o.mfu));
  if (o.max_batched_tokens < 1) return invalid_argument("--max-batched-tokens must be positive");
  if (o.max_num_seqs < 1) return invalid_argument("--max-num-seqs must be positive");
  if (o.block_size < 1 || o.block_size > 4096) return invalid_argument("--block-size must be in [1, 4096]");
  if (!(std::isfinite(o.overhead_gib) && o.overhead_gib >= 0)) return invalid_argument("--overhead-gib must be >= 0");

  // ---- formats ----
  const bool has_file = model.stored_weight_bytes > 0;
  if (o.dtype.empty()) o.dtype = has_file ? "file" : "bf16";
  o.dtype = lower(o.dtype);
  WeightFormat layer_fmt;
  if (o.dtype == "file") {
    if (!has_file) {
      return invalid_argument("--dtype file needs a GGUF model file; '" + model.source + "' holds no weights");
    }
    if (o.weight_bits || !o.head_dtype.empty()) {
      return invalid_argument("--weight-bits and --head-dtype apply to a uniform --dtype, not to --dtype file");
    }
    layer_fmt = {"file", 0, ComputeRate::k16, ""};
  } else {
    OSP_ASSIGN_OR_RETURN(layer_fmt, weight_format(o.dtype));
  }
  p.dtype = layer_fmt.name;
  if (layer_fmt.rate == ComputeRate::kFp8 && gpu.tflops_fp8 <= 0) {
    return unsupported(gpu.name +
                       " has no FP8 tensor cores: --dtype fp8 is not supported on it (use bf16, fp16, int8 "
                       "where it has INT8, or a weight-only int4/q4_1)");
  }
  if (layer_fmt.rate == ComputeRate::kInt8 && gpu.tops_int8 <= 0) {
    return unsupported(gpu.name +
                       " has no INT8 tensor cores: --dtype int8 (W8A8) is not supported on it (use bf16 "
                       "or fp16, or a weight-only int4/q4_1)");
  }
  if (!gpu.bf16 && (p.dtype == "bf16" || lower(o.kv_dtype) == "bf16" || o.kv_dtype.empty())) {
    p.notes.push_back(gpu.name + " has no bf16: what is bf16 here is planned as fp16 (same size, same rate)");
  }
  if (gpu.approximate) p.notes.push_back(gpu.name + ": some figures are approximate (docs/plan.md)");
  if (o.kv_dtype.empty()) o.kv_dtype = gpu.bf16 ? "bf16" : "fp16";
  o.kv_dtype = lower(o.kv_dtype);
  if (o.kv_dtype == "fp8_e4m3") o.kv_dtype = "fp8";  // serve's other spelling
  OSP_ASSIGN_OR_RETURN(p.kv_bytes, kv_dtype_bytes(o.kv_dtype, model.head_dim));
  p.kv_dtype = o.kv_dtype;
  if (p.kv_dtype == "fp8" && gpu.tflops_fp8 <= 0) {
    p.notes.push_back("fp8 KV on a GPU without FP8: stored as fp8, converted to 16 bits for attention");
  }

  // ---- parameters ----
  const int64_t h = model.hidden_size;
  p.params_total = model.num_parameters;
  p.params_embedding = static_cast<int64_t>(model.vocab_size) * h;
  p.params_head = p.params_embedding;
  p.params_layers = p.params_total - p.params_embedding - h - (model.tie_word_embeddings ? 0 : p.params_head);
  if (p.params_layers <= 0) return invalid_argument("model '" + model.source + "': parameter count is inconsistent");
  const double q_dim = static_cast<double>(model.num_heads) * model.head_dim;

  // ---- weight bytes ----
  const double tp = o.tp;
  double embedding_bytes = 0, head_bytes = 0;
  if (p.dtype == "file") {
    p.weight_bytes_total = static_cast<double>(model.stored_weight_bytes);
    embedding_bytes = static_cast<double>(model.stored_embedding_bytes);
    head_bytes = model.tie_word_embeddings ? embedding_bytes : static_cast<double>(model.stored_lm_head_bytes);
    const double layer_bytes = p.weight_bytes_total - embedding_bytes -
                               (model.tie_word_embeddings ? 0 : static_cast<double>(model.stored_lm_head_bytes));
    p.layer_bits = layer_bytes * 8 / static_cast<double>(p.params_layers);
    p.head_bits = head_bytes * 8 / static_cast<double>(p.params_head);
    p.head_dtype = "file";
    p.dtype = "file (" + (model.stored_matrix_dtype.empty() ? std::string("?") : model.stored_matrix_dtype) + ")";
  } else {
    if (o.head_dtype.empty()) o.head_dtype = layer_fmt.head_default;
    OSP_ASSIGN_OR_RETURN(WeightFormat head_fmt, weight_format(o.head_dtype));
    p.head_dtype = head_fmt.name;
    p.layer_bits = layer_fmt.bits;
    if (o.weight_bits) {
      if (!(std::isfinite(*o.weight_bits) && *o.weight_bits > 0 && *o.weight_bits <= 32)) {
        return invalid_argument("--weight-bits must be in (0, 32], got " + fmt(*o.weight_bits));
      }
      p.layer_bits = *o.weight_bits;
    }
    p.head_bits = head_fmt.bits;
    embedding_bytes = static_cast<double>(p.params_embedding) * p.head_bits / 8;
    head_bytes = static_cast<double>(p.params_head) * p.head_bits / 8;
    const double layer_bytes = static_cast<double>(p.params_layers) * p.layer_bits / 8;
    const double norm_bytes = static_cast<double>(h) * 2;
    p.weight_bytes_total = layer_bytes + embedding_bytes + (model.tie_word_embeddings ? 0 : head_bytes) + norm_bytes;
  }
  p.weight_bytes_per_gpu = p.weight_bytes_total / tp;
  // An untied embedding is only gathered (a few rows per step), not streamed.
  p.weight_read_bytes_per_gpu = (p.weight_bytes_total - (model.tie_word_embeddings ? 0 : embedding_bytes)) / tp;

  // ---- KV cache ----
  p.kv_heads_per_gpu = kv_split ? model.num_kv_heads / o.tp : 1;
  if (!kv_split) {
    p.notes.push_back("--tp " + std::to_string(o.tp) + " exceeds the " + std::to_string(model.num_kv_heads) +
                      " KV heads: each GPU keeps a replica of one KV head");
  }
  p.kv_bytes_per_token_total = 2.0 * model.num_layers * model.num_kv_heads * model.head_dim * p.kv_bytes;
  p.kv_bytes_per_token_per_gpu = 2.0 * model.num_layers * p.kv_heads_per_gpu * model.head_dim * p.kv_bytes;

  // ---- memory budget (per GPU) ----
  p.usable_bytes = gpu.memory_gib * kGiB * o.gpu_memory_utilization;
  const double tokens = static_cast<double>(o.max_batched_tokens);
  const double per_token_activation =
      (3.0 * model.intermediate_size / tp + 4.0 * h + (q_dim + 2.0 * model.num_kv_heads * model.head_dim) / tp) *
      kActivationBytes;
  const double logits = static_cast<double>(std::min(o.max_batched_tokens, o.max_num_seqs)) * model.vocab_size * 4;
  p.activation_bytes = tokens * per_token_activation + logits;
  p.reserve_bytes = o.overhead_gib * kGiB + p.activation_bytes;
  p.kv_budget_bytes = p.usable_bytes - p.weight_bytes_per_gpu - p.reserve_bytes;
  p.context = o.context;
  p.context_kv = model.sliding_window > 0 ? std::min<int64_t>(o.context, model.sliding_window) : o.context;
  const double page_bytes = p.kv_bytes_per_token_per_gpu * static_cast<double>(o.block_size);
  const int64_t pages = p.kv_budget_bytes > 0 ? static_cast<int64_t>(std::floor(p.kv_budget_bytes / page_bytes)) : 0;
  p.kv_tokens = pages * o.block_size;
  const int64_t pages_per_seq = (p.context_kv + o.block_size - 1) / o.block_size;
  p.max_batch = pages / pages_per_seq;
  auto gib = [](double b) { return fmt(std::round(b / kGiB * 100) / 100) + " GiB"; };
  if (p.usable_bytes < p.weight_bytes_per_gpu + p.reserve_bytes) {
    p.fit_problem = "weights (" + gib(p.weight_bytes_per_gpu) + " per GPU) and the reserve (" + gib(p.reserve_bytes) +
                    ") exceed the usable memory (" + gib(p.usable_bytes) + ")";
  } else if (p.max_batch < 1) {
    p.fit_problem = "the KV budget (" + gib(p.kv_budget_bytes) + ", " + std::to_string(p.kv_tokens) +
                    " tokens) holds no sequence of context " + std::to_string(p.context);
  }
  p.fits = p.fit_problem.empty();

  // ---- rates ----
  Rates sol;
  sol.matmul = rate_flops(gpu, layer_fmt.rate);
  sol.attn = gpu.tflops_16 * 1e12;
  sol.bandwidth = gpu.bandwidth_gbs * 1e9;
  const double lm = static_cast<double>(model.num_layers);

  // ---- prefill: one prompt, logits for its last token only ----
  {
    const double n = static_cast<double>(o.prompt_len);
    Work w;
    w.matmul_flops = (2.0 * static_cast<double>(p.params_layers) * n + 2.0 * static_cast<double>(p.params_head)) / tp;
    w.attn_flops = 4.0 * lm * q_dim * causal_key_count(o.prompt_len, model.sliding_window) / tp;
    w.bytes = p.weight_read_bytes_per_gpu + n * p.kv_bytes_per_token_per_gpu;
    w.tokens = o.prompt_len;
    p.prefill_flops = w.matmul_flops + w.attn_flops;
    p.prefill_flops_total = p.prefill_flops * tp;
    p.prefill_bytes = w.bytes;
    p.ttft_sol = evaluate(w, sol, 1.0, 1.0, p);
    p.ttft_expected = evaluate(w, sol, o.mfu, o.mbu, p);
  }

  // ---- decode: every sequence holds context_kv tokens of KV ----
  std::vector<int64_t> batches = o.batches;
  if (p.fits && std::find(batches.begin(), batches.end(), p.max_batch) == batches.end()) batches.push_back(p.max_batch);
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  const double ctx = static_cast<double>(p.context_kv);
  const double token_matmul = 2.0 * static_cast<double>(p.params_layers + p.params_head) / tp;
  const double token_attn = 4.0 * lm * q_dim * ctx / tp;
  const double seq_kv_bytes = ctx * p.kv_bytes_per_token_per_gpu;
  for (int64_t b : batches) {
    DecodePoint d;
    d.batch = b;
    d.fits = p.fits && b <= p.max_batch;
    const double bb = static_cast<double>(b);
    Work w;
    w.matmul_flops = token_matmul * bb;
    w.attn_flops = token_attn * bb;
    w.bytes = p.weight_read_bytes_per_gpu + bb * seq_kv_bytes;
    w.tokens = b;
    d.flops = w.matmul_flops + w.attn_flops;
    d.bytes = w.bytes;
    d.sol = evaluate(w, sol, 1.0, 1.0, p);
    d.expected = evaluate(w, sol, o.mfu, o.mbu, p);
    d.tokens_per_s_per_gpu_sol = bb / d.sol.time_s / tp;
    d.tokens_per_s_per_gpu = bb / d.expected.time_s / tp;
    if (o.price_per_hour > 0) {
      d.cost_per_mtok_sol = o.price_per_hour / 3600.0 / d.tokens_per_s_per_gpu_sol * 1e6;
      d.cost_per_mtok = o.price_per_hour / 3600.0 / d.tokens_per_s_per_gpu * 1e6;
    }
    p.decode.push_back(d);
  }
  const double token_compute_sol = token_matmul / sol.matmul + token_attn / sol.attn;
  const double weight_s = p.weight_read_bytes_per_gpu / sol.bandwidth;
  const double seq_kv_s = seq_kv_bytes / sol.bandwidth;
  p.crossover_sol = crossover(token_compute_sol, weight_s, seq_kv_s);
  p.crossover_expected = crossover(token_compute_sol / o.mfu, weight_s / o.mbu, seq_kv_s / o.mbu);
  p.crossover_weights_only_sol = crossover(token_matmul / sol.matmul, weight_s, 0);
  p.crossover_weights_only_expected = crossover(token_matmul / sol.matmul / o.mfu, weight_s / o.mbu, 0);
  return p;
}

Expected<CompareSpec> parse_compare(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos) {
    return invalid_argument("--compare '" + text + "' must be FIELD=V1,V2,... (FIELD: gpu, dtype, kv-dtype, tp)");
  }
  CompareSpec c;
  c.field = lower(text.substr(0, eq));
  if (c.field == "kv_dtype") c.field = "kv-dtype";
  if (c.field != "gpu" && c.field != "dtype" && c.field != "kv-dtype" && c.field != "tp") {
    return invalid_argument("--compare field '" + text.substr(0, eq) + "' is not one of gpu, dtype, kv-dtype, tp");
  }
  std::string rest = text.substr(eq + 1);
  size_t start = 0;
  while (true) {
    const size_t comma = rest.find(',', start);
    std::string v = rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    while (!v.empty() && v.front() == ' ') v.erase(v.begin());
    while (!v.empty() && v.back() == ' ') v.pop_back();
    if (v.empty()) return invalid_argument("--compare '" + text + "' has an empty value");
    c.values.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (c.values.size() > 16) return invalid_argument("--compare takes at most 16 values");
  return c;
}

Expected<std::vector<int64_t>> parse_batches(const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string v = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (v.empty() || v.size() > 9 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return invalid_argument("--batch '" + text + "' must be positive integers separated by commas");
    }
    const int64_t b = std::stoll(v);
    if (b < 1) return invalid_argument("--batch sizes must be positive, got " + v);
    out.push_back(b);
    if (comma == std::string::npos) break;
    start = comma + 1;
    if (out.size() > 64) return invalid_argument("--batch lists more than 64 sizes");
  }
  return out;
}

}  // namespace osprey::plan
