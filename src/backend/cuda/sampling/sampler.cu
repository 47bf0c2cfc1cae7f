// The device sampler: one block of kThreads per sampled row.
//
// 1. Edits (bias, min_tokens masks, repetition and frequency/presence
//    penalties) are applied to a copy of the row in scratch, with the host
//    sampler's float operations (round-to-nearest intrinsics, no contraction).
// 2. Greedy: argmax, ties to the lowest id (a deterministic block reduction).
// 3. Otherwise the weights exp((x - max) / T) (double) of the finite tokens
//    that pass min-p; top-k by a radix select on the order-preserving bits
//    of x (ties at the cut to the lower ids); top-p by a radix select on the
//    mass, with weights in 2^-40 fixed point so that every sum is an exact
//    integer and the result never depends on the order of atomics; the draw
//    walks the kept tokens in id order to u * total.
// 4. Logprobs of the raw row: log_softmax in double, rank, and the top
//    entries by repeated arg-max below the previous one.
// Each thread owns a contiguous chunk of ids where id order matters (tie
// ranks, the draw); reductions and scans are CUB's, deterministic for a
// fixed block size, so a row's result depends on its logits and parameters
// alone, never on the other rows.
#include <cfloat>
#include <climits>
#include <cmath>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/sampling/sampler.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 512;
constexpr double kFixedScale = 1099511627776.0;  // 2^40

struct Best {
  float v;
  int i;
};

struct BetterOp {
  __device__ Best operator()(const Best& a, const Best& b) const {
    if (a.v > b.v) return a;
    if (b.v > a.v) return b;
    return a.i <= b.i ? a : b;
  }
};

struct MaxOp {
  __device__ float operator()(float a, float b) const { return a > b ? a : b; }
};

__device__ inline uint32_t order_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ inline float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Must equal osprey::splitmix64 / sampling_uniform (src/sampling/rng.h).
__device__ __host__ inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

__device__ inline double uniform01(uint64_t seed, int seq_index, int64_t position) {
  uint64_t h = mix64(seed);
  h = mix64(h ^ (static_cast<uint64_t>(seq_index) * 0xd1b54a32d192ed03ULL));
  h = mix64(h ^ static_cast<uint64_t>(position));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

using ReduceBest = cub::BlockReduce<Best, kThreads>;
using ReduceF = cub::BlockReduce<float, kThreads>;
using ReduceD = cub::BlockReduce<double, kThreads>;
using ReduceI = cub::BlockReduce<int, kThreads>;
using ReduceU = cub::BlockReduce<unsigned long long, kThreads>;
using ScanI = cub::BlockScan<int, kThreads>;
using ScanU = cub::BlockScan<unsigned long long, kThreads>;

struct Shared {
  union {
    ReduceBest::TempStorage best;
    ReduceF::TempStorage f;
    ReduceD::TempStorage d;
    ReduceI::TempStorage i;
    ReduceU::TempStorage u;
    ScanI::TempStorage si;
    ScanU::TempStorage su;
  } tmp;
  unsigned long long hist[256];
  unsigned long long prefix[kThreads + 1];  // draw: inclusive sums of the chunks before each thread
  int tie_off[kThreads];                    // ties at the cut key in the chunks before each thread
  Best best;
  float f;
  double d;
  int i;
  unsigned long long u;
  uint32_t key;
  int token;
};

// Calls f(value, id) for every id < V of row x. 16-byte loads, kUnroll of
// them in flight per thread, where x is 16-byte aligned (a row of logits:
// the scan is bound by the bytes in flight, with one block per row and
// often fewer rows than SMs); one float at a time otherwise and for the
// tail. The order of the calls is not the id order: f must not depend on it.
template <class F>
__device__ __forceinline__ void for_each_logit(const float* x, int64_t V, F f) {
  constexpr int kUnroll = 4;
  int64_t tail = 0;
  if ((reinterpret_cast<uintptr_t>(x) & 15u) == 0) {
    const int64_t v4 = V / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    int64_t j = threadIdx.x;
    for (; j + (kUnroll - 1) * kThreads < v4; j += kUnroll * kThreads) {
      float4 q[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) q[u] = x4[j + u * kThreads];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = 4 * (j + u * kThreads);
        f(q[u].x, i);
        f(q[u].y, i + 1);
        f(q[u].z, i + 2);
        f(q[u].w, i + 3);
      }
    }
    for (; j < v4; j += kThreads) {
      const float4 q = x4[j];
      f(q.x, 4 * j);
      f(q.y, 4 * j + 1);
      f(q.z, 4 * j + 2);
      f(q.w, 4 * j + 3);
    }
    tail = 4 * v4;
  }
  for (int64_t i = tail + threadIdx.x; i < V; i += kThreads) f(x[i], i);
}

// The block's best (value desc, id asc) over ids whose (value, id) sorts
// after (pv, pi); pi < 0: over all. NaN never counts. The comparison is a
// total order on (value, id), so the result does not depend on which thread
// saw which id.
__device__ Best block_best(Shared& sh, const float* x, int64_t V, float pv, int pi) {
  Best b{-INFINITY, INT_MAX};
  for_each_logit(x, V, [&](float v, int64_t i) {
    if (v != v) return;
    if (pi >= 0 && !(v < pv || (v == pv && i > pi))) return;
    if (v > b.v || (v == b.v && i < b.i)) b = Best{v, static_cast<int>(i)};
  });
  const Best r = ReduceBest(sh.tmp.best).Reduce(b, BetterOp());
  if (threadIdx.x == 0) sh.best = r;
  __syncthreads();
  const Best out = sh.best;
  __syncthreads();
  return out;
}

// The greedy token: block_best over all ids, 0 where every value is NaN
// (as the host's argmax).
__device__ int greedy_token(Shared& sh, const float* x, int64_t V) {
  const int i = block_best(sh, x, V, 0.0f, -1).i;
  return i == INT_MAX ? 0 : i;
}

__device__ float block_max(Shared& sh, const float* x, int64_t V) {
  float m = -INFINITY;
  for_each_logit(x, V, [&](float v, int64_t) {
    if (v > m) m = v;  // NaN never wins
  });
  const float r = ReduceF(sh.tmp.f).Reduce(m, MaxOp());
  if (threadIdx.x == 0) sh.f = r;
  __syncthreads();
  const float out = sh.f;
  __syncthreads();
  return out;
}

template <class T, class Reduce, class Storage>
__device__ T block_sum(Storage& storage, T* slot, T v) {
  const T r = Reduce(storage).Sum(v);
  if (threadIdx.x == 0) *slot = r;
  __syncthreads();
  const T out = *slot;
  __syncthreads();
  return out;
}

// The sampling distribution of one row (see the file comment).
struct Dist {
  const float* x;
  float m;
  double inv_t;
  double log_min_p;
  __device__ double weight(float l) const {
    if (!(l > -INFINITY)) return 0.0;  // -inf and NaN
    const double s = (static_cast<double>(l) - static_cast<double>(m)) * inv_t;
    if (s < log_min_p) return 0.0;
    const double w = exp(s);
    return w > 0.0 ? w : 0.0;
  }
};

// Kept tokens: weight > 0 and (key > cut or (key == cut and tie rank < cut_ties)),
// tie ranks counted in id order (tie_off + position among the chunk's ties).
struct Cut {
  uint32_t key = 0;
  int ties = INT_MAX;
};

// Per-thread chunk of ids [lo, hi).
struct Chunk {
  int64_t lo, hi;
};

__device__ Chunk my_chunk(int64_t V) {
  const int64_t per = (V + kThreads - 1) / kThreads;
  const int64_t lo = min(V, per * threadIdx.x);
  return Chunk{lo, min(V, lo + per)};
}

// Walks this thread's chunk, calling f(id, weight, key) for each kept token.
template <class F>
__device__ void for_kept(const Dist& d, const Cut& cut, const Shared& sh, Chunk c, F f) {
  int tie = sh.tie_off[threadIdx.x];
  for (int64_t i = c.lo; i < c.hi; ++i) {
    const float l = d.x[i];
    const double w = d.weight(l);
    if (w <= 0.0) continue;
    const uint32_t k = order_key(l);
    if (k < cut.key) continue;
    if (k == cut.key) {
      if (tie >= cut.ties) continue;
      ++tie;
    }
    f(i, w, k);
  }
}

// tie_off[t] = candidates with key == cut_key in the chunks before thread t.
__device__ void scan_ties(Shared& sh, const Dist& d, Chunk c, uint32_t cut_key) {
  int mine = 0;
  for (int64_t i = c.lo; i < c.hi; ++i) {
    const float l = d.x[i];
    if (order_key(l) == cut_key && d.weight(l) > 0.0) ++mine;
  }
  int off = 0;
  ScanI(sh.tmp.si).ExclusiveSum(mine, off);
  sh.tie_off[threadIdx.x] = off;
  __syncthreads();
}

__device__ int sample_row(Shared& sh, const float* x, int64_t V, const DeviceSampleRow& row) {
  const float m = block_max(sh, x, V);
  if (!isfinite(m)) return greedy_token(sh, x, V);  // nothing finite: greedy, as the host does
  Dist d{x, m, 1.0 / static_cast<double>(row.temperature),
         row.min_p > 0.0f ? log(static_cast<double>(row.min_p)) : -INFINITY};
  const Chunk c = my_chunk(V);
  Cut cut;
  sh.tie_off[threadIdx.x] = 0;
  __syncthreads();

  if (row.top_k > 0 && row.top_k < V) {
    int mine = 0;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) mine += d.weight(x[i]) > 0.0;
    const int candidates = block_sum<int, ReduceI>(sh.tmp.i, &sh.i, mine);
    if (row.top_k < candidates) {
      // The top_k-th largest key among candidates, 8 bits at a time.
      uint32_t prefix = 0, mask = 0;
      int remaining = row.top_k;
      for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += kThreads) sh.hist[b] = 0;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < V; i += kThreads) {
          const float l = x[i];
          const uint32_t k = order_key(l);
          if ((k & mask) == prefix && d.weight(l) > 0.0) atomicAdd(&sh.hist[(k >> shift) & 255u], 1ULL);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
          int sel = 0;
          for (int b = 255; b >= 0; --b) {
            const int h = static_cast<int>(sh.hist[b]);
            if (h >= remaining) {
              sel = b;
              break;
            }
            remaining -= h;
          }
          sh.key = prefix | (static_cast<uint32_t>(sel) << shift);
          sh.i = remaining;
        }
        __syncthreads();
        prefix = sh.key;
        remaining = sh.i;
        mask |= 255u << shift;
        __syncthreads();
      }
      cut.key = prefix;
      cut.ties = remaining;
      scan_ties(sh, d, c, cut.key);
    }
  }

  if (row.top_p < 1.0f) {
    unsigned long long mine = 0;
    for_kept(d, cut, sh, c, [&](int64_t, double w, uint32_t) { mine += __double2ull_rn(w * kFixedScale); });
    const unsigned long long total = block_sum<unsigned long long, ReduceU>(sh.tmp.u, &sh.u, mine);
    const double target = static_cast<double>(row.top_p) * static_cast<double>(total);
    // The largest key K with mass(key >= K) >= target.
    uint32_t prefix = 0, mask = 0;
    unsigned long long above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = threadIdx.x; b < 256; b += kThreads) sh.hist[b] = 0;
      __syncthreads();
      for_kept(d, cut, sh, c, [&](int64_t, double w, uint32_t k) {
        if ((k & mask) == prefix) atomicAdd(&sh.hist[(k >> shift) & 255u], __double2ull_rn(w * kFixedScale));
      });
      __syncthreads();
      if (threadIdx.x == 0) {
        int sel = -1, last_nonzero = 0;
        for (int b = 255; b >= 0; --b) {
          if (static_cast<double>(above + sh.hist[b]) >= target) {
            sel = b;
            break;
          }
          above += sh.hist[b];
          if (sh.hist[b]) last_nonzero = b;
        }
        if (sel < 0) {  // only by rounding: the smallest bucket with mass
          sel = last_nonzero;
          above -= sh.hist[sel];
        }
        sh.key = prefix | (static_cast<uint32_t>(sel) << shift);
        sh.u = above;
      }
      __syncthreads();
      prefix = sh.key;
      above = sh.u;
      mask |= 255u << shift;
      __syncthreads();
    }
    // Ties at K: the j-th (id order) is kept while above + j * w_K < target.
    const unsigned long long wk = __double2ull_rn(d.weight(key_value(prefix)) * kFixedScale);
    long long keep = INT_MAX;
    if (wk > 0) {
      const double q = (target - static_cast<double>(above)) / static_cast<double>(wk);
      keep = q >= static_cast<double>(INT_MAX) ? INT_MAX : static_cast<long long>(ceil(q));
    }
    if (keep < 1) keep = 1;
    if (prefix == cut.key) {
      cut.ties = static_cast<int>(min(static_cast<long long>(cut.ties), keep));
    } else {
      cut.key = prefix;
      cut.ties = static_cast<int>(keep);
      scan_ties(sh, d, c, cut.key);
    }
  }

  // Draw: the first kept id (id order) whose cumulative weight exceeds u * total.
  unsigned long long mine = 0;
  int64_t last = -1;
  for_kept(d, cut, sh, c, [&](int64_t i, double w, uint32_t) {
    mine += __double2ull_rn(w * kFixedScale);
    last = i;
  });
  unsigned long long incl = 0, aggregate = 0;
  ScanU(sh.tmp.su).InclusiveSum(mine, incl, aggregate);
  sh.prefix[threadIdx.x + 1] = incl;
  if (threadIdx.x == 0) {
    sh.prefix[0] = 0;
    sh.token = -1;
  }
  __syncthreads();
  const double u = uniform01(row.seed, row.seq_index, row.position);
  const unsigned long long target = static_cast<unsigned long long>(u * static_cast<double>(aggregate));
  const unsigned long long lo = sh.prefix[threadIdx.x], hi = sh.prefix[threadIdx.x + 1];
  if (hi > lo && target >= lo && target < hi) {
    unsigned long long acc = lo;
    int found = -1;
    for_kept(d, cut, sh, c, [&](int64_t i, double w, uint32_t) {
      if (found >= 0) return;
      acc += __double2ull_rn(w * kFixedScale);
      if (acc > target) found = static_cast<int>(i);
    });
    sh.token = found >= 0 ? found : static_cast<int>(last);
  }
  __syncthreads();
  int token = sh.token;
  __syncthreads();
  if (token < 0) {  // every kept weight rounded to 0 in fixed point: the best token
    token = greedy_token(sh, x, V);
  }
  return token;
}

__global__ void __launch_bounds__(kThreads) sampler_kernel(SamplerArgs a) {
  __shared__ Shared sh;
  const DeviceSampleRow row = a.rows[blockIdx.x];
  const int64_t V = a.vocab;
  const float* raw = a.logits + static_cast<int64_t>(row.logit_row) * V;
  const float* x = raw;
  if (row.scratch_row >= 0) {
    float* s = a.scratch + static_cast<int64_t>(row.scratch_row) * V;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) s[i] = raw[i];
    __syncthreads();
    const int32_t* ids = a.edit_ids + row.edit_begin;
    const float* vals = a.edit_vals + row.edit_begin;
    // Ids are distinct within each section (masks may repeat: same value).
    for (int j = threadIdx.x; j < row.num_bias; j += kThreads) {
      const int32_t id = ids[j];
      if (id >= 0 && id < V) s[id] = __fadd_rn(s[id], vals[j]);
    }
    __syncthreads();
    ids += row.num_bias;
    vals += row.num_bias;
    for (int j = threadIdx.x; j < row.num_mask; j += kThreads) {
      const int32_t id = ids[j];
      if (id >= 0 && id < V) s[id] = -INFINITY;
    }
    __syncthreads();
    ids += row.num_mask;
    vals += row.num_mask;
    const float rp = row.repetition_penalty;
    for (int j = threadIdx.x; j < row.num_rep; j += kThreads) {
      const int32_t id = ids[j];
      if (id < 0 || id >= V) continue;
      const float l = s[id];
      s[id] = l > 0.0f ? __fdiv_rn(l, rp) : __fmul_rn(l, rp);
    }
    __syncthreads();
    ids += row.num_rep;
    vals += row.num_rep;
    for (int j = threadIdx.x; j < row.num_freq; j += kThreads) {
      const int32_t id = ids[j];
      if (id < 0 || id >= V) continue;
      s[id] = __fsub_rn(s[id], __fadd_rn(__fmul_rn(vals[j], row.frequency_penalty), row.presence_penalty));
    }
    __syncthreads();
    x = s;
  }

  const int token = row.temperature <= kGreedyTemperature ? greedy_token(sh, x, V) : sample_row(sh, x, V, row);
  if (threadIdx.x == 0) a.tokens[blockIdx.x] = token;
  if (row.num_logprobs < 0) return;

  // Logprobs of the raw row.
  const float m = block_max(sh, raw, V);
  double lse = m;
  if (isfinite(m)) {
    double part = 0.0;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) part += exp(static_cast<double>(raw[i]) - m);
    const double sum = block_sum<double, ReduceD>(sh.tmp.d, &sh.d, part);
    lse = static_cast<double>(m) + log(sum);
  }
  const float lt = raw[token];
  int higher = 0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) higher += raw[i] > lt;
  const int rank = 1 + block_sum<int, ReduceI>(sh.tmp.i, &sh.i, higher);
  float* top_lp = a.top_logprobs + static_cast<int64_t>(blockIdx.x) * kMaxDeviceTopLogprobs;
  int32_t* top_id = a.top_ids + static_cast<int64_t>(blockIdx.x) * kMaxDeviceTopLogprobs;
  Best prev{0.0f, -1};
  const int n = min(row.num_logprobs, kMaxDeviceTopLogprobs);
  for (int j = 0; j < kMaxDeviceTopLogprobs; ++j) {
    if (j < n && j < V) {
      prev = block_best(sh, raw, V, prev.v, prev.i);
      if (threadIdx.x == 0) {
        top_id[j] = prev.i;
        top_lp[j] = static_cast<float>(static_cast<double>(prev.v) - lse);
      }
    } else if (threadIdx.x == 0) {
      top_id[j] = -1;
      top_lp[j] = 0.0f;
    }
  }
  if (threadIdx.x == 0) {
    a.logprobs[blockIdx.x] = static_cast<float>(static_cast<double>(lt) - lse);
    a.ranks[blockIdx.x] = rank;
  }
}

__global__ void uniform_kernel(const uint64_t* seeds, const int32_t* seq_index, const int64_t* positions, int n,
                               double* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = uniform01(seeds[i], seq_index[i], positions[i]);
}

}  // namespace

void launch_sampler(const SamplerArgs& a, cudaStream_t stream) {
  if (a.num_rows <= 0) return;
  sampler_kernel<<<static_cast<unsigned>(a.num_rows), kThreads, 0, stream>>>(a);
  OSP_CUDA_CHECK_LAUNCH();
}

void device_sampling_uniform(const uint64_t* seeds, const int32_t* seq_index, const int64_t* positions, int n,
                             double* out, cudaStream_t stream) {
  if (n <= 0) return;
  uniform_kernel<<<static_cast<unsigned>((n + 127) / 128), 128, 0, stream>>>(seeds, seq_index, positions, n, out);
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
