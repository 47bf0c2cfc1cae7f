// The device sampler (src/backend/cuda/sampling) against the host sampler
// (src/sampling) on random logits: greedy ids identical (ties to the lowest
// id), processed rows (bias, min_tokens masks, penalties) bit-identical,
// logprobs / ranks / top entries as compute_logprobs, seeded draws without
// truncation equal the host's, draws with top-k / top-p / min-p always inside
// the host's kept set, a row's result independent of the other rows, and
// the device's uniform numbers equal sampling_uniform.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/sampling/sampler.h"
#include "gpu_test_util.h"
#include "osprey/engine.h"
#include "sampling/device_sampling.h"
#include "sampling/logits_processors.h"
#include "sampling/logprobs.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"

namespace osprey::gpu_test {
namespace {

// One sampled row described on the host: its parameters and token history.
struct HostRow {
  SamplingParams p;
  std::vector<int32_t> prompt, output, stop_ids;
  uint64_t seed = 0;
  int seq_index = 0;
  int64_t position = 0;
  int logit_row = 0;
};

struct DeviceOut {
  std::vector<DeviceSampleResult> results;
  std::vector<float> scratch;  // processed rows
};

class SamplingTest : public GpuTest {
 protected:
  // Runs the device sampler over logits [num_logit_rows, vocab] for `rows`.
  DeviceOut run(const std::vector<float>& logits, int64_t vocab, const std::vector<HostRow>& rows) {
    std::vector<DeviceSampleRow> drows;
    DeviceSampleEdits edits;
    int scratch_rows = 0;
    for (const HostRow& h : rows) {
      DeviceSampleRow r;
      r.logit_row = h.logit_row;
      const size_t before = edits.ids.size();
      make_device_sample_row(h.p, h.prompt, h.output, h.stop_ids, h.seed, h.seq_index, h.position, r, edits);
      r.scratch_row = edits.ids.size() > before ? scratch_rows++ : -1;
      drows.push_back(r);
    }
    const size_t n = rows.size();
    DeviceMem d_logits = upload(gpu(), logits);
    DeviceMem d_rows = upload_bytes(gpu(), drows.data(), drows.size() * sizeof(DeviceSampleRow));
    edits.ids.push_back(0);  // never empty
    edits.vals.push_back(0.0f);
    DeviceMem d_ids = upload(gpu(), edits.ids);
    DeviceMem d_vals = upload(gpu(), edits.vals);
    DeviceMem d_scratch(gpu(), std::max<size_t>(1, static_cast<size_t>(scratch_rows) * vocab) * sizeof(float));
    DeviceMem d_tok(gpu(), n * 4), d_lp(gpu(), n * 4), d_rank(gpu(), n * 4);
    DeviceMem d_top_ids(gpu(), n * kMaxDeviceTopLogprobs * 4), d_top_lp(gpu(), n * kMaxDeviceTopLogprobs * 4);
    ops::Backend::SampleBatch b;
    b.logits = d_logits.as<float>();
    b.vocab = vocab;
    b.num_rows = static_cast<int>(n);
    b.rows = d_rows.get();
    b.edit_ids = d_ids.as<int32_t>();
    b.edit_vals = d_vals.as<float>();
    b.scratch = d_scratch.as<float>();
    b.tokens = d_tok.as<int32_t>();
    b.logprobs = d_lp.as<float>();
    b.ranks = d_rank.as<int32_t>();
    b.top_ids = d_top_ids.as<int32_t>();
    b.top_logprobs = d_top_lp.as<float>();
    gpu().sample(b);
    gpu().synchronize();
    auto tok = download<int32_t>(gpu(), d_tok, n);
    auto lp = download<float>(gpu(), d_lp, n);
    auto rank = download<int32_t>(gpu(), d_rank, n);
    auto top_ids = download<int32_t>(gpu(), d_top_ids, n * kMaxDeviceTopLogprobs);
    auto top_lp = download<float>(gpu(), d_top_lp, n * kMaxDeviceTopLogprobs);
    DeviceOut out;
    out.results.resize(n);
    for (size_t i = 0; i < n; ++i) {
      DeviceSampleResult& r = out.results[i];
      r.token = tok[i];
      r.logprob = lp[i];
      r.rank = rank[i];
      std::copy_n(top_ids.begin() + i * kMaxDeviceTopLogprobs, kMaxDeviceTopLogprobs, r.top_ids);
      std::copy_n(top_lp.begin() + i * kMaxDeviceTopLogprobs, kMaxDeviceTopLogprobs, r.top_logprobs);
    }
    out.scratch = download<float>(gpu(), d_scratch, static_cast<size_t>(scratch_rows) * vocab);
    return out;
  }

  static SampleResult host_sample(const std::vector<float>& logits, int64_t vocab, const HostRow& h) {
    Sampler s(static_cast<int>(vocab));
    SampleInput in;
    in.params = &h.p;
    in.prompt = h.prompt;
    in.output = h.output;
    in.stop_ids = h.stop_ids;
    in.seed = h.seed;
    in.seq_index = h.seq_index;
    in.position = h.position;
    return s.sample(logits.data() + static_cast<size_t>(h.logit_row) * vocab, in);
  }

  static std::vector<float> random_logits(int rows, int64_t vocab, uint32_t seed, float scale = 4.0f) {
    std::vector<float> v = random_floats(static_cast<size_t>(rows) * vocab, seed, -scale, scale);
    // Ties at the maximum: a copy of the row's max at a later and an earlier id.
    std::mt19937 rng(seed);
    for (int r = 0; r < rows; r += 3) {
      float* row = v.data() + static_cast<size_t>(r) * vocab;
      const int64_t a = rng() % vocab, b = rng() % vocab;
      row[a] = row[b] = scale + 1.0f;
    }
    return v;
  }
};

TEST_F(SamplingTest, GreedyEqualsHostArgmaxWithTies) {
  for (int64_t vocab : {int64_t{49152}, int64_t{1007}, int64_t{128256}}) {
    const int rows = 24;
    std::vector<float> logits = random_logits(rows, vocab, 11 + static_cast<uint32_t>(vocab));
    std::vector<HostRow> hr(rows);
    for (int r = 0; r < rows; ++r) {
      hr[r].p.temperature = 0.0f;
      hr[r].logit_row = rows - 1 - r;  // rows out of order
    }
    DeviceOut d = run(logits, vocab, hr);
    for (int r = 0; r < rows; ++r)
      EXPECT_EQ(d.results[r].token, host_sample(logits, vocab, hr[r]).token) << "vocab " << vocab << " row " << r;
  }
}

// The scan's 16-byte path and its tail (vocab 128258: two floats past the
// last whole group; odd rows misaligned, so the one-float path too), with
// NaN and -inf entries, a maximum in the tail, ties across the vectorised
// groups, an all -inf row and an all-NaN row: the host's greedy choice and
// logprobs each time.
TEST_F(SamplingTest, GreedyScanPathsWithNanInfAndTail) {
  const int64_t vocab = 128258;
  const int rows = 8;
  std::vector<float> logits = random_floats(static_cast<size_t>(rows) * vocab, 77, -3.0f, 3.0f);
  auto row = [&](int r) { return logits.data() + static_cast<size_t>(r) * vocab; };
  for (int r = 0; r < rows; ++r) {
    for (int64_t i = r; i < vocab; i += 997) row(r)[i] = std::numeric_limits<float>::quiet_NaN();
    for (int64_t i = 3 * r + 1; i < vocab; i += 1009) row(r)[i] = -std::numeric_limits<float>::infinity();
  }
  row(0)[vocab - 1] = 9.0f;                      // the maximum in the tail
  row(1)[4 * 512 * 4 + 3] = row(1)[70001] = 9.0f;  // a tie across groups: the lower id
  row(2)[5] = 9.0f;                              // the first group
  for (int64_t i = 0; i < vocab; ++i) row(3)[i] = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) row(4)[i] = std::numeric_limits<float>::quiet_NaN();
  std::vector<HostRow> hr(rows);
  for (int r = 0; r < rows; ++r) {
    hr[r].p.temperature = 0.0f;
    hr[r].p.logprobs = r % 2 == 0 ? 3 : -1;
    hr[r].logit_row = r;
  }
  DeviceOut d = run(logits, vocab, hr);
  for (int r = 0; r < rows; ++r) {
    const SampleResult h = host_sample(logits, vocab, hr[r]);
    EXPECT_EQ(d.results[r].token, h.token) << "row " << r;
  }
  EXPECT_EQ(d.results[0].token, vocab - 1);
  EXPECT_EQ(d.results[1].token, 4 * 512 * 4 + 3);
  EXPECT_EQ(d.results[2].token, 5);
}

TEST_F(SamplingTest, ProcessedRowsBitIdenticalAndGreedyEqual) {
  const int64_t vocab = 5003;
  const int rows = 8;
  std::vector<float> logits = random_logits(rows, vocab, 5);
  std::mt19937 rng(3);
  std::vector<HostRow> hr(rows);
  for (int r = 0; r < rows; ++r) {
    HostRow& h = hr[r];
    h.logit_row = r;
    h.p.temperature = 0.0f;
    for (int i = 0; i < 40; ++i) h.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    for (int i = 0; i < 30; ++i) h.output.push_back(static_cast<int32_t>(rng() % 50));  // repeats
    h.stop_ids = {1, 2, 2, 7};
    if (r % 2 == 0) h.p.repetition_penalty = 1.3f;
    if (r % 3 == 0) h.p.frequency_penalty = 0.7f;
    if (r % 4 == 0) h.p.presence_penalty = -0.4f;
    if (r != 5) h.p.logit_bias = {{3, 2.5f}, {static_cast<int32_t>(vocab - 1), -1.0f}, {9, 30.0f}};
    if (r % 2 == 1) h.p.min_tokens = 100;  // masks the stop ids
  }
  DeviceOut d = run(logits, vocab, hr);
  int scratch_row = 0;
  for (int r = 0; r < rows; ++r) {
    const HostRow& h = hr[r];
    EXPECT_EQ(d.results[r].token, host_sample(logits, vocab, h).token) << "row " << r;
    // The processed row, exactly as the host sampler builds it.
    std::vector<float> ref(logits.begin() + static_cast<size_t>(r) * vocab,
                           logits.begin() + static_cast<size_t>(r + 1) * vocab);
    std::span<float> row(ref);
    apply_logit_bias(row, h.p.logit_bias);
    if (static_cast<int>(h.output.size()) < h.p.min_tokens) mask_tokens(row, h.stop_ids);
    apply_repetition_penalty(row, h.prompt, h.output, h.p.repetition_penalty);
    apply_frequency_presence(row, h.output, h.p.frequency_penalty, h.p.presence_penalty);
    const float* got = d.scratch.data() + static_cast<size_t>(scratch_row++) * vocab;
    int mismatches = 0;
    for (int64_t i = 0; i < vocab; ++i) mismatches += std::memcmp(&got[i], &ref[i], 4) != 0;
    EXPECT_EQ(mismatches, 0) << "row " << r;
  }
}

TEST_F(SamplingTest, LogprobsMatchHost) {
  const int64_t vocab = 32000;
  const int rows = 6;
  std::vector<float> logits = random_logits(rows, vocab, 17, 8.0f);
  std::vector<HostRow> hr(rows);
  for (int r = 0; r < rows; ++r) {
    hr[r].logit_row = r;
    hr[r].p.temperature = r < 3 ? 0.0f : 0.9f;
    hr[r].p.logprobs = (r * 7) % 21;
    hr[r].seed = 100 + r;
    hr[r].position = 12;
    if (r == 4) hr[r].p.logit_bias = {{5, 40.0f}};  // logprobs stay those of the raw row
  }
  DeviceOut d = run(logits, vocab, hr);
  for (int r = 0; r < rows; ++r) {
    const DeviceSampleResult& g = d.results[r];
    std::span<const float> raw(logits.data() + static_cast<size_t>(r) * vocab, vocab);
    LogprobData ref = compute_logprobs(raw, g.token, hr[r].p.logprobs);
    EXPECT_NEAR(g.logprob, ref.logprob, 1e-5) << "row " << r;
    EXPECT_EQ(g.rank, ref.rank) << "row " << r;
    ASSERT_EQ(static_cast<int>(ref.top.size()), hr[r].p.logprobs);
    for (size_t j = 0; j < ref.top.size(); ++j) {
      EXPECT_EQ(g.top_ids[j], ref.top[j].first) << "row " << r << " entry " << j;
      EXPECT_NEAR(g.top_logprobs[j], ref.top[j].second, 1e-5) << "row " << r << " entry " << j;
    }
    if (r == 4) {
      EXPECT_EQ(g.token, 5);
    }
  }
}

// Top logprobs at the edges of the device's bucket list: +0 and -0 tied at
// the top (equal values: id order), more tied maxima than entries, fewer
// finite logits than entries (the rest -inf: the arg-max passes), and a
// row whose values span more than the buckets do.
TEST_F(SamplingTest, TopLogprobsEdgesMatchHost) {
  const int64_t vocab = 1000;
  const int rows = 4;
  std::vector<float> logits = random_floats(static_cast<size_t>(rows) * vocab, 41, -8.0f, -1.0f);
  auto row = [&](int r) { return logits.data() + static_cast<size_t>(r) * vocab; };
  row(0)[10] = 0.0f;
  row(0)[3] = -0.0f;
  row(0)[500] = 0.0f;
  row(0)[7] = -0.5f;
  for (int64_t i = 0; i < vocab; i += 40) row(1)[i] = 2.0f;  // 25 tied maxima
  for (int64_t i = 0; i < vocab; ++i) row(2)[i] = i % 97 == 0 ? -1.0f - 0.01f * static_cast<float>(i) : -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) row(3)[i] = -100.0f + 0.2f * static_cast<float>(i);  // 200 logits wide
  std::vector<HostRow> hr(rows);
  for (int r = 0; r < rows; ++r) {
    hr[r].logit_row = r;
    hr[r].p.temperature = 0.0f;
    hr[r].p.logprobs = 20;
  }
  DeviceOut d = run(logits, vocab, hr);
  for (int r = 0; r < rows; ++r) {
    const DeviceSampleResult& g = d.results[r];
    std::span<const float> raw(row(r), vocab);
    LogprobData ref = compute_logprobs(raw, g.token, 20);
    EXPECT_EQ(g.rank, ref.rank) << "row " << r;
    EXPECT_NEAR(g.logprob, ref.logprob, 1e-5) << "row " << r;
    ASSERT_EQ(ref.top.size(), 20u);
    for (size_t j = 0; j < ref.top.size(); ++j) {
      EXPECT_EQ(g.top_ids[j], ref.top[j].first) << "row " << r << " entry " << j;
      if (std::isfinite(ref.top[j].second)) {
        EXPECT_NEAR(g.top_logprobs[j], ref.top[j].second, 1e-5) << "row " << r << " entry " << j;
      } else {
        EXPECT_EQ(g.top_logprobs[j], ref.top[j].second) << "row " << r << " entry " << j;
      }
    }
  }
  EXPECT_EQ(d.results[0].top_ids[0], 3);  // -0 and +0 tie: the lower id first
  EXPECT_EQ(d.results[0].top_ids[1], 10);
  EXPECT_EQ(d.results[0].top_ids[2], 500);
}

TEST_F(SamplingTest, UntruncatedDrawsEqualHostDraws) {
  // Without top-k / top-p both samplers walk the tokens in id order.
  const int64_t vocab = 2048;
  const int rows = 200;
  std::vector<float> logits = random_logits(rows, vocab, 23, 3.0f);
  std::vector<HostRow> hr(rows);
  for (int r = 0; r < rows; ++r) {
    hr[r].logit_row = r;
    hr[r].p.temperature = 0.5f + 0.01f * static_cast<float>(r % 50);
    hr[r].seed = 1000 + static_cast<uint64_t>(r);
    hr[r].seq_index = r % 3;
    hr[r].position = 40 + r;
  }
  DeviceOut d = run(logits, vocab, hr);
  int same = 0;
  for (int r = 0; r < rows; ++r) same += d.results[r].token == host_sample(logits, vocab, hr[r]).token;
  // Fixed-point weights can move a draw that lands within ~1e-12 of a boundary.
  EXPECT_GE(same, rows - 2);
}

TEST_F(SamplingTest, TruncatedDrawsStayInHostKeptSet) {
  const int64_t vocab = 300;
  std::vector<float> logits = random_logits(1, vocab, 29, 2.0f);
  struct Case {
    int top_k;
    float top_p, min_p, temperature;
  };
  const std::vector<Case> cases = {{10, 1.0f, 0.0f, 1.0f}, {0, 0.5f, 0.0f, 1.0f}, {0, 1.0f, 0.3f, 0.7f},
                                   {40, 0.8f, 0.05f, 1.3f}, {1, 1.0f, 0.0f, 1.0f}, {0, 0.01f, 0.0f, 1.0f}};
  for (const Case& c : cases) {
    std::vector<HostRow> hr(256);
    for (size_t i = 0; i < hr.size(); ++i) {
      hr[i].p.temperature = c.temperature;
      hr[i].p.top_k = c.top_k;
      hr[i].p.top_p = c.top_p;
      hr[i].p.min_p = c.min_p;
      hr[i].seed = 7;
      hr[i].position = static_cast<int64_t>(i);
    }
    Candidates kept;
    truncate_distribution(std::span<const float>(logits.data(), vocab), c.temperature, c.min_p, c.top_k, c.top_p,
                          kept);
    const std::set<int32_t> allowed(kept.ids.begin(), kept.ids.end());
    DeviceOut d = run(logits, vocab, hr);
    std::set<int32_t> seen;
    for (const auto& r : d.results) {
      EXPECT_TRUE(allowed.count(r.token)) << "token " << r.token << " outside the kept set (k " << c.top_k << ", p "
                                          << c.top_p << ", min_p " << c.min_p << ")";
      seen.insert(r.token);
    }
    if (allowed.size() > 4) {
      EXPECT_GT(seen.size(), 2u) << "draws should spread over the kept set";
    }
  }
}

// The device sampler's own semantics (sampling/device_sampling.h and the
// comment of sampler.cu), written plainly on the host: weights exp((x -
// max) / T) in double, fixed-point 2^-40 masses, the top-k cut by key with
// ties kept in id order, the top-p cut at the largest key whose mass from
// the top reaches top_p * total (ties at it kept while the mass before them
// stays below the target), the draw walking the kept tokens in id order.
// The device must give exactly this token: any change to how its passes
// run (vectorised, per-warp histograms, the list in shared memory) must not
// change a single draw.
int device_model_token(const float* x, int64_t V, const DeviceSampleRow& r) {
  auto greedy = [&] {
    float bv = -std::numeric_limits<float>::infinity();
    int64_t bi = -1;
    for (int64_t i = 0; i < V; ++i) {
      if (x[i] != x[i]) continue;
      if (bi < 0 || x[i] > bv) {
        bv = x[i];
        bi = i;
      }
    }
    return bi < 0 ? 0 : static_cast<int>(bi);
  };
  if (r.temperature <= kGreedyTemperature) return greedy();
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i)
    if (x[i] > m) m = x[i];
  if (!std::isfinite(m)) return greedy();
  const double inv_t = 1.0 / static_cast<double>(r.temperature);
  const double log_min_p = r.min_p > 0.0f ? std::log(static_cast<double>(r.min_p)) : -INFINITY;
  auto weight = [&](float l) {
    if (!(l > -INFINITY)) return 0.0;
    const double s = (static_cast<double>(l) - static_cast<double>(m)) * inv_t;
    if (s < log_min_p) return 0.0;
    const double w = std::exp(s);
    return w > 0.0 ? w : 0.0;
  };
  auto fixed = [&](float l) {
    const double w = weight(l);
    return w > 0.0 ? static_cast<uint64_t>(std::nearbyint(w * 1099511627776.0)) : uint64_t{0};
  };
  auto key = [](float l) {
    uint32_t u;
    std::memcpy(&u, &l, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  };
  std::vector<int64_t> pos;  // positive tokens, id order
  for (int64_t i = 0; i < V; ++i)
    if (weight(x[i]) > 0.0) pos.push_back(i);
  uint32_t cut_key = 0;
  int64_t cut_ties = std::numeric_limits<int64_t>::max();
  if (r.top_k > 0 && r.top_k < V && r.top_k < static_cast<int64_t>(pos.size())) {
    std::vector<uint32_t> keys;
    for (int64_t i : pos) keys.push_back(key(x[i]));
    std::sort(keys.begin(), keys.end(), std::greater<>());
    cut_key = keys[static_cast<size_t>(r.top_k) - 1];
    cut_ties = r.top_k - std::count_if(keys.begin(), keys.end(), [&](uint32_t k) { return k > cut_key; });
  }
  auto kept = [&] {
    std::vector<int64_t> out;
    int64_t rank = 0;
    for (int64_t i : pos) {
      const uint32_t k = key(x[i]);
      if (k > cut_key || (k == cut_key && rank++ < cut_ties)) out.push_back(i);
    }
    return out;
  };
  if (r.top_p < 1.0f) {
    // (key, mass) of the kept tokens, keys descending.
    std::vector<std::pair<uint32_t, uint64_t>> km;
    uint64_t total = 0;
    for (int64_t i : kept()) {
      km.emplace_back(key(x[i]), fixed(x[i]));
      total += fixed(x[i]);
    }
    std::sort(km.begin(), km.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    const double target = static_cast<double>(r.top_p) * static_cast<double>(total);
    uint64_t cum = 0, above = 0;
    uint32_t K = 0;
    bool found = false;
    for (size_t j = 0; j < km.size();) {
      size_t e = j;
      uint64_t w = 0;
      for (; e < km.size() && km[e].first == km[j].first; ++e) w += km[e].second;
      if (w > 0 && static_cast<double>(cum + w) >= target) {
        K = km[j].first;
        above = cum;
        found = true;
        break;
      }
      cum += w;
      j = e;
    }
    if (!found) {  // only by rounding: the smallest key with mass
      uint64_t wK = 0;
      for (size_t j = 0; j < km.size(); ++j)
        if (km[j].second > 0) K = km[j].first;
      for (const auto& [k, w] : km)
        if (k == K) wK += w;
      above = total - wK;
    }
    float kv = 0.0f;  // the logit of key K
    {
      const uint32_t u = (K & 0x80000000u) ? (K & 0x7fffffffu) : ~K;
      std::memcpy(&kv, &u, 4);
    }
    const uint64_t wk = fixed(kv);
    int64_t keep = INT_MAX;
    if (wk > 0) {
      const double q = (target - static_cast<double>(above)) / static_cast<double>(wk);
      keep = q >= static_cast<double>(INT_MAX) ? INT_MAX : static_cast<int64_t>(std::ceil(q));
    }
    keep = std::max<int64_t>(keep, 1);
    if (K == cut_key) {
      cut_ties = std::min(cut_ties, keep);
    } else {
      cut_key = K;
      cut_ties = keep;
    }
  }
  const std::vector<int64_t> ids = kept();
  uint64_t aggregate = 0;
  for (int64_t i : ids) aggregate += fixed(x[i]);
  const double u = sampling_uniform(r.seed, r.seq_index, r.position);
  const uint64_t target = static_cast<uint64_t>(u * static_cast<double>(aggregate));
  uint64_t acc = 0;
  for (int64_t i : ids) {
    acc += fixed(x[i]);
    if (acc > target) return static_cast<int>(i);
  }
  return greedy();
}

// Every truncation path of the device sampler (top-k below and above its
// shared-memory list, top-p alone and after top-k, min-p, temperature only;
// top-p's cut inside and beyond its buckets) on flat, peaked, coarse (many
// equal values, so ties at the cuts) and wide (+-40) logits,
// with -inf and NaN entries, at vocabularies that do and do not fill 16-byte
// groups: each row's token equals device_model_token's.
TEST_F(SamplingTest, DrawsEqualTheDeviceSemanticsModel) {
  struct P {
    float t, top_p, min_p;
    int top_k;
  };
  const std::vector<P> params = {
      {0.8f, 1.0f, 0.0f, 0},    {0.8f, 0.9f, 0.0f, 0},    {1.3f, 0.5f, 0.0f, 0},    {0.8f, 1.0f, 0.0f, 50},
      {0.8f, 0.9f, 0.0f, 50},   {0.7f, 0.95f, 0.0f, 1},   {1.0f, 1.0f, 0.0f, 2000}, {1.0f, 0.6f, 0.0f, 2000},
      {0.8f, 1.0f, 0.05f, 0},   {1.1f, 0.8f, 0.02f, 0},   {0.8f, 0.05f, 0.0f, 0},   {2.0f, 0.99f, 0.0f, 7},
      {1.0f, 1.0f, 0.0f, 3000}, {0.9f, 0.7f, 0.0f, 3000}, {4.0f, 0.97f, 0.0f, 0},   {3.0f, 0.999f, 0.0f, 0}};
  int checked = 0;
  for (int64_t vocab : {int64_t{128256}, int64_t{5003}}) {
    for (int kind = 0; kind < 4; ++kind) {
      const int rows = 12;
      std::vector<float> logits(static_cast<size_t>(rows) * vocab);
      std::mt19937 rng(100 + kind + static_cast<uint32_t>(vocab));
      std::uniform_real_distribution<float> uni(-4.0f, 4.0f), wide(-40.0f, 40.0f);
      std::normal_distribution<float> nrm(0.0f, 2.5f);
      for (size_t i = 0; i < logits.size(); ++i) {
        float v = kind == 1 ? nrm(rng) : kind == 3 ? wide(rng) : uni(rng);
        if (kind == 2) v = std::round(v * 4.0f) / 4.0f;  // 33 distinct values: ties everywhere
        logits[i] = v;
      }
      for (int r = 0; r < rows; ++r) {
        float* row = logits.data() + static_cast<size_t>(r) * vocab;
        if (kind == 1)
          for (int j = 0; j < 20; ++j) row[rng() % vocab] += 6.0f + 0.3f * static_cast<float>(j);
        for (int64_t i = r; i < vocab; i += 1013) row[i] = -std::numeric_limits<float>::infinity();
        if (r % 3 == 1) row[(r * 7919) % vocab] = std::numeric_limits<float>::quiet_NaN();
      }
      for (const P& p : params) {
        std::vector<HostRow> hr(rows);
        std::vector<DeviceSampleRow> dr(rows);
        for (int r = 0; r < rows; ++r) {
          hr[r].logit_row = r;
          hr[r].p.temperature = p.t;
          hr[r].p.top_p = p.top_p;
          hr[r].p.top_k = p.top_k;
          hr[r].p.min_p = p.min_p;
          hr[r].seed = 5000 + static_cast<uint64_t>(r) * 31 + static_cast<uint64_t>(kind);
          hr[r].seq_index = r % 4;
          hr[r].position = 3 + r;
          DeviceSampleEdits unused;
          make_device_sample_row(hr[r].p, std::span<const int32_t>(), std::span<const int32_t>(),
                                 std::span<const int32_t>(), hr[r].seed, hr[r].seq_index, hr[r].position, dr[r],
                                 unused);
        }
        DeviceOut d = run(logits, vocab, hr);
        for (int r = 0; r < rows; ++r) {
          const int want = device_model_token(logits.data() + static_cast<size_t>(r) * vocab, vocab, dr[r]);
          EXPECT_EQ(d.results[r].token, want) << "vocab " << vocab << " kind " << kind << " row " << r << " T " << p.t
                                              << " top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 4 * 12 * 16);
}

TEST_F(SamplingTest, RowResultIndependentOfBatch) {
  const int64_t vocab = 49152;
  std::vector<float> logits = random_logits(8, vocab, 31);
  HostRow probe;
  probe.logit_row = 5;
  probe.p.temperature = 0.8f;
  probe.p.top_p = 0.9f;
  probe.p.top_k = 50;
  probe.p.repetition_penalty = 1.1f;
  probe.prompt = {1, 2, 3};
  probe.seed = 99;
  probe.position = 7;
  probe.p.logprobs = 3;
  DeviceOut alone = run(logits, vocab, {probe});
  std::vector<HostRow> many(12);
  for (size_t i = 0; i < many.size(); ++i) {
    many[i].logit_row = static_cast<int>(i % 8);
    many[i].p.temperature = (i % 2) ? 0.0f : 1.0f;
    many[i].p.frequency_penalty = 0.3f;
    many[i].output = {4, 4, 5};
    many[i].seed = i;
  }
  many[7] = probe;
  DeviceOut batched = run(logits, vocab, many);
  EXPECT_EQ(batched.results[7].token, alone.results[0].token);
  EXPECT_EQ(batched.results[7].logprob, alone.results[0].logprob);
}

TEST_F(SamplingTest, DeviceUniformEqualsHost) {
  const int n = 1000;
  std::vector<uint64_t> seeds(n);
  std::vector<int32_t> idx(n);
  std::vector<int64_t> pos(n);
  std::mt19937_64 rng(5);
  for (int i = 0; i < n; ++i) {
    seeds[i] = rng();
    idx[i] = static_cast<int32_t>(rng() % 128);
    pos[i] = static_cast<int64_t>(rng() % 100000);
  }
  DeviceMem ds = upload(gpu(), seeds), di = upload(gpu(), idx), dp = upload(gpu(), pos);
  DeviceMem out(gpu(), n * sizeof(double));
  auto* be = dynamic_cast<cuda::CudaBackend*>(&gpu());
  ASSERT_NE(be, nullptr);
  cuda::device_sampling_uniform(ds.as<uint64_t>(), di.as<int32_t>(), dp.as<int64_t>(), n, out.as<double>(),
                                be->stream());
  auto got = download<double>(gpu(), out, n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], sampling_uniform(seeds[i], idx[i], pos[i])) << i;
}

}  // namespace
}  // namespace osprey::gpu_test
