// The device sampler: one block of kThreads per sampled row.
//
// 1. Edits (bias, min_tokens masks, repetition and frequency/presence
//    penalties) are applied to a copy of the row in scratch, with the host
//    sampler's float operations (round-to-nearest intrinsics, no contraction).
// 2. Greedy: argmax, ties to the lowest id (a deterministic block reduction).
// 3. Otherwise the weights exp((x - max) / T) (double) of the finite tokens
//    that pass min-p, in 2^-40 fixed point so that every sum is an exact
//    integer and no result depends on the order of a pass; top-k keeps the
//    top_k largest keys (the order-preserving bits of x; ties at the cut to
//    the lower ids); top-p keeps the largest keys while the mass of the
//    better ones is below top_p * total (ties at its cut likewise); the draw
//    walks the kept tokens in id order to u * total.
//    How (the same result every way; DrawsEqualTheDeviceSemanticsModel
//    checks it against a plain host model):
//    - top_k <= kListMax: a histogram of (max - x) in 2048 buckets finds the
//      best buckets that hold top_k tokens; those tokens go to a list in
//      shared memory, are sorted by key, and the first top_k stay.
//    - otherwise radix selects over the whole row, 8 bits of the key at a
//      time, with per-warp histograms (counts combined across a warp's lanes
//      first); the cut's ties become an id limit, so that every pass is
//      vectorised and in no particular order.
//    - top-p and the draw on the list when the kept set fits it (after
//      top-k, min-p or the top-p cut), else over the row: each warp sums its
//      part of the ids in 128-id tiles and only the tile that holds u * total
//      is walked in order.
// 4. Logprobs of the raw row: log_softmax (float exps summed in double) and
//    the rank in one pass; the top entries from a sorted list of the best
//    buckets' tokens (one arg-max pass each where that list cannot hold
//    them).
// Reductions and scans are CUB's, deterministic for a fixed block size, and
// the integer masses make every sum exact, so a row's result depends on its
// logits and parameters alone, never on the other rows.
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

// Truncation and draw work on a list in shared memory when the kept set is
// small (top-k, min-p, a top-p cut): at most kListMax tokens.
constexpr int kListMax = 2048;
constexpr int kListPerThread = kListMax / 512;  // entries a thread scans
constexpr int kWarps = kThreads / 32;
// exp(s) * 2^40 < 0.5 for every s below this (exp(-28.5) * 2^40 = 0.46):
// the fixed-point weight is 0 without computing exp.
constexpr double kFixedZeroBelow = -28.5;
// Top-k's prefilter: tokens by floor((max - x) * kBucketScale), the last
// bucket for everything further down.
constexpr int kBuckets = 2048;
constexpr float kBucketScale = 64.0f;
// vocab_draw: 128-id tiles per warp held in shared memory (vocabularies up
// to kWarps * kTiles * 128 = 262,144 ids; beyond, the warp walks its part).
constexpr int kTiles = 128;

struct ListEntry {
  unsigned long long w;  // fixed-point weight
  uint32_t key;
  int id;
};

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
  union {
    unsigned long long whist[kWarps][256];  // per-warp histograms of a radix pass
    ListEntry list[kListMax];
    unsigned bucket_count[kBuckets];              // top-k's prefilter
    struct {
      unsigned long long mass[kBuckets];
    } bucket;  // top-p's prefilter
    unsigned long long tile_sum[kWarps][kTiles];  // vocab_draw: mass of each 128-id tile
  } big;
  unsigned long long hist[256];
  unsigned long long warp_sum[kWarps];
  Best best;
  float f;
  double d;
  int i;
  unsigned long long u;
  long long ll;
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

// The sampling distribution of one row (see the file comment). weight()
// is the defining formula; positive() and fixed() give weight() > 0 and
// the fixed-point weight without calling exp where the result is known.
struct Dist {
  const float* x;
  float m;
  double inv_t;
  double log_min_p;
  __device__ double scaled(float l) const { return (static_cast<double>(l) - static_cast<double>(m)) * inv_t; }
  __device__ double weight(float l) const {
    if (!(l > -INFINITY)) return 0.0;  // -inf and NaN
    const double s = scaled(l);
    if (s < log_min_p) return 0.0;
    const double w = exp(s);
    return w > 0.0 ? w : 0.0;
  }
  __device__ bool positive(float l) const {
    if (!(l > -INFINITY)) return false;
    const double s = scaled(l);
    if (s < log_min_p) return false;
    return s > -700.0 || exp(s) > 0.0;  // exp underflows to 0 only below ~-745
  }
  __device__ unsigned long long fixed(float l) const {
    if (!(l > -INFINITY)) return 0;
    const double s = scaled(l);
    if (s < log_min_p || s < kFixedZeroBelow) return 0;
    const double w = exp(s);
    return w > 0.0 ? __double2ull_rn(w * kFixedScale) : 0;
  }
};

// Kept tokens: positive and (key > key_cut or (key == key_cut and id <=
// tie_limit)); tie_limit is the id of the last kept tie, the rank rule
// "ties at the cut kept in id order while rank < count" turned into an id,
// so that membership does not depend on the order of a pass.
struct Cut {
  uint32_t key = 0;
  long long tie_limit = LLONG_MAX;
  __device__ bool keeps(uint32_t k, int64_t id) const { return k > key || (k == key && id <= tie_limit); }
};

// Calls f(v, id, valid) for every id < V in groups of 4 consecutive ids per
// thread, kUnroll groups' loads in flight; every thread of the block makes
// the same number of calls (warp-uniform: f may use warp intrinsics), with
// valid = false past V.
template <class F>
__device__ __forceinline__ void for_each_uniform(const float* x, int64_t V, F f) {
  constexpr int kUnroll = 4;
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  const int64_t groups = (V + 3) / 4;
  const int64_t step = int64_t{kThreads} * kUnroll;
  for (int64_t g0 = 0; g0 < groups; g0 += step) {
    float q[kUnroll][4];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = g0 + u * kThreads + threadIdx.x;
      const int64_t i = 4 * g;
      if (g < groups && vec && i + 4 <= V) {
        const float4 t = reinterpret_cast<const float4*>(x)[g];
        q[u][0] = t.x;
        q[u][1] = t.y;
        q[u][2] = t.z;
        q[u][3] = t.w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) q[u][e] = (g < groups && i + e < V) ? x[i + e] : -INFINITY;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = 4 * (g0 + u * kThreads + threadIdx.x);
#pragma unroll
      for (int e = 0; e < 4; ++e) f(q[u][e], i + e, i + e < V);
    }
  }
}

// Clears the per-warp histograms.
__device__ void clear_whist(Shared& sh) {
  unsigned long long* h = &sh.big.whist[0][0];
  for (int j = threadIdx.x; j < kWarps * 256; j += kThreads) h[j] = 0;
  __syncthreads();
}

// hist[b] = the warps' histograms summed (after a pass).
__device__ void merge_whist(Shared& sh) {
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += kThreads) {
    unsigned long long t = 0;
    for (int w = 0; w < kWarps; ++w) t += sh.big.whist[w][b];
    sh.hist[b] = t;
  }
  __syncthreads();
}

// Adds c to the warp's histogram bin b (b = 256: nothing), the lanes that
// share a bin combined first (one atomic per distinct bin).
__device__ __forceinline__ void warp_count(Shared& sh, int b, unsigned c) {
  const unsigned same = __match_any_sync(0xffffffffu, b);
  const unsigned total = __reduce_add_sync(same, c);
  if (b < 256 && (threadIdx.x & 31) == __ffs(same) - 1)
    atomicAdd(&sh.big.whist[threadIdx.x >> 5][b], static_cast<unsigned long long>(total));
}

// The number of positive tokens with key == key; the id of the c-th of
// them (1-based, id order), or LLONG_MAX when there are at most c.
__device__ long long tie_limit_id(Shared& sh, const Dist& d, int64_t V, uint32_t key, long long c) {
  int mine = 0;
  for_each_uniform(d.x, V, [&](float l, int64_t, bool valid) { mine += valid && order_key(l) == key && d.positive(l); });
  const int ties = block_sum<int, ReduceI>(sh.tmp.i, &sh.i, mine);
  if (ties <= c) return LLONG_MAX;
  // Rare (equal logits at the cut): each thread counts its contiguous chunk.
  const int64_t per = (V + kThreads - 1) / kThreads;
  const int64_t lo = min(V, per * threadIdx.x), hi = min(V, lo + per);
  int chunk = 0;
  for (int64_t i = lo; i < hi; ++i) chunk += order_key(d.x[i]) == key && d.positive(d.x[i]);
  int off = 0;
  ScanI(sh.tmp.si).ExclusiveSum(chunk, off);
  if (off < c && c <= off + chunk) {
    long long need = c - off;
    for (int64_t i = lo; i < hi; ++i) {
      if (order_key(d.x[i]) == key && d.positive(d.x[i]) && --need == 0) {
        sh.ll = i;
        break;
      }
    }
  }
  __syncthreads();
  const long long out = sh.ll;
  __syncthreads();
  return out;
}

// Bitonic sort of list[0, n) padded to a power of two (sentinels sort last)
// by less(a, b).
template <class Less>
__device__ void sort_list(Shared& sh, int n, Less less) {
  int p = 1;
  while (p < n) p <<= 1;
  for (int j = n + static_cast<int>(threadIdx.x); j < p; j += kThreads) sh.big.list[j] = ListEntry{0, 0, INT_MAX};
  __syncthreads();
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < p / 2; t += kThreads) {
        const int lo = 2 * t - (t & (stride - 1));
        const int hi = lo + stride;
        const bool up = (lo & size) == 0;
        ListEntry a = sh.big.list[lo], b = sh.big.list[hi];
        if (less(b, a) == up) {
          sh.big.list[lo] = b;
          sh.big.list[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

// Sentinels (id INT_MAX) after every real entry.
__device__ __forceinline__ bool by_key_desc(const ListEntry& a, const ListEntry& b) {
  if ((a.id == INT_MAX) != (b.id == INT_MAX)) return b.id == INT_MAX;
  return a.key > b.key || (a.key == b.key && a.id < b.id);
}
__device__ __forceinline__ bool by_id(const ListEntry& a, const ListEntry& b) { return a.id < b.id; }

// Inclusive sums of list[j].w over j < n (in place: w becomes the running
// sum); returns the total. kListPerThread consecutive entries a thread.
__device__ unsigned long long scan_list(Shared& sh, int n) {
  static_assert(kListPerThread * kThreads == kListMax, "the list spreads over the block");
  const int j0 = kListPerThread * threadIdx.x;
  unsigned long long w[kListPerThread], part = 0;
#pragma unroll
  for (int e = 0; e < kListPerThread; ++e) {
    w[e] = j0 + e < n ? sh.big.list[j0 + e].w : 0;
    part += w[e];
  }
  unsigned long long incl = 0, total = 0;
  ScanU(sh.tmp.su).InclusiveSum(part, incl, total);
  __syncthreads();
  unsigned long long run = incl - part;
#pragma unroll
  for (int e = 0; e < kListPerThread; ++e) {
    run += w[e];
    if (j0 + e < n) sh.big.list[j0 + e].w = run;
  }
  __syncthreads();
  return total;
}

// The top-p cut over the kept masses: the largest key K whose mass(key >=
// K) reaches target (the smallest key with mass when rounding leaves none
// that does), above = mass(key > K); returns how many ties at K stay
// (id order): kept while above + j * w_K < target, at least 1.
__device__ long long top_p_keep(const Dist& d, uint32_t K, unsigned long long above, double target) {
  const unsigned long long wk = __double2ull_rn(d.weight(key_value(K)) * kFixedScale);
  long long keep = INT_MAX;
  if (wk > 0) {
    const double q = (target - static_cast<double>(above)) / static_cast<double>(wk);
    keep = q >= static_cast<double>(INT_MAX) ? INT_MAX : static_cast<long long>(ceil(q));
  }
  return keep < 1 ? 1 : keep;
}

// List path: list[0, n) holds every kept token (id, key, fixed weight);
// applies top-p (top_p < 1) and draws in id order. -1: every kept weight
// is 0 (the caller takes the greedy token). top_p_total > 0: the kept mass
// of the whole row, when the list holds only its best tokens (the top-p
// prefilter); the cut then still falls inside the list.
__device__ int list_draw(Shared& sh, const Dist& d, int n, float top_p, double u,
                         unsigned long long top_p_total = 0) {
  if (top_p < 1.0f && n > 0) {
    sort_list(sh, n, by_key_desc);
    // Keys descending, ties in id order; w -> running mass.
    const unsigned long long list_total = scan_list(sh, n);
    const unsigned long long total = top_p_total > 0 ? top_p_total : list_total;
    const double target = static_cast<double>(top_p) * static_cast<double>(total);
    if (threadIdx.x == 0) {
      // The first entry whose running mass reaches target: its key is K.
      int j = 0;
      while (j < n && static_cast<double>(sh.big.list[j].w) < target) ++j;
      if (j == n) {  // only by rounding: the smallest key with mass
        j = n - 1;
        while (j > 0 && sh.big.list[j].w == sh.big.list[j - 1].w) --j;
      }
      const uint32_t K = sh.big.list[j].key;
      int first = j;
      while (first > 0 && sh.big.list[first - 1].key == K) --first;
      int last = j;
      while (last + 1 < n && sh.big.list[last + 1].key == K) ++last;
      const unsigned long long above = first > 0 ? sh.big.list[first - 1].w : 0;
      const long long keep = top_p_keep(d, K, above, target);
      sh.i = static_cast<int>(min(static_cast<long long>(last + 1), first + keep));  // kept: list[0, i)
    }
    __syncthreads();
    const int kept = sh.i;
    __syncthreads();
    // The kept entries' own weights again (w holds running sums), then id order.
    for (int j = threadIdx.x; j < kept; j += kThreads) sh.big.list[j].w = d.fixed(d.x[sh.big.list[j].id]);
    __syncthreads();
    n = kept;
  }
  sort_list(sh, n, by_id);
  const unsigned long long aggregate = scan_list(sh, n);
  const unsigned long long target = static_cast<unsigned long long>(u * static_cast<double>(aggregate));
  if (threadIdx.x == 0) sh.token = -1;
  __syncthreads();
  // The first entry whose running weight exceeds target.
  for (int j = threadIdx.x; j < n; j += kThreads) {
    const unsigned long long prev = j > 0 ? sh.big.list[j - 1].w : 0;
    if (sh.big.list[j].w > target && prev <= target) sh.token = sh.big.list[j].id;
  }
  __syncthreads();
  const int token = sh.token;
  __syncthreads();
  return token;
}

// Full-vocabulary draw: the first kept id (id order) whose running weight
// exceeds u * total. Warp w owns the ids [w S, (w + 1) S) (S a multiple of
// 128) and sums them 128 at a time (4 a lane), keeping each tile's sum;
// the tile holding the target is then walked once, in order. -1: every
// kept weight is 0.
__device__ int vocab_draw(Shared& sh, const Dist& d, int64_t V, const Cut& cut, double u) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t seg = ((V + kWarps - 1) / kWarps + 127) / 128 * 128;
  const int64_t lo = min(V, warp * seg), hi = min(V, lo + seg);
  const bool tiles_fit = seg / 128 <= kTiles;
  // i is a multiple of 4 (lo and the tiles are): one 16-byte load where the row allows.
  const bool vec = (reinterpret_cast<uintptr_t>(d.x) & 15u) == 0;
  auto load4 = [&](int64_t i, float (&l)[4]) {
    if (vec && i + 4 <= hi) {
      const float4 q = *reinterpret_cast<const float4*>(d.x + i);
      l[0] = q.x;
      l[1] = q.y;
      l[2] = q.z;
      l[3] = q.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) l[e] = i + e < hi ? d.x[i + e] : -INFINITY;
    }
  };
  auto weigh4 = [&](int64_t i, const float (&l)[4], unsigned long long (&w)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = (i + e < hi && cut.keeps(order_key(l[e]), i + e)) ? d.fixed(l[e]) : 0;
  };
  auto w4 = [&](int64_t i, unsigned long long (&w)[4]) {
    float l[4];
    load4(i, l);
    weigh4(i, l, w);
  };
  auto warp_total = [&](unsigned long long v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  };
  // Four tiles' loads in flight, then their weights.
  constexpr int kAhead = 4;
  unsigned long long mine = 0;
  int t = 0;
  for (int64_t g0 = lo; g0 < hi; g0 += 128 * kAhead) {
    float l[kAhead][4];
#pragma unroll
    for (int a = 0; a < kAhead; ++a) load4(g0 + 128 * a + 4 * lane, l[a]);
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      const int64_t i0 = g0 + 128 * a;
      if (i0 >= hi) break;  // warp-uniform
      unsigned long long w[4];
      weigh4(i0 + 4 * lane, l[a], w);
      const unsigned long long part = w[0] + w[1] + w[2] + w[3];
      if (tiles_fit) {
        const unsigned long long tile = warp_total(part);
        if (lane == 0) sh.big.tile_sum[warp][t] = tile;
      }
      ++t;
      mine += part;
    }
  }
  mine = warp_total(mine);
  if (lane == 0) sh.warp_sum[warp] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long aggregate = 0;
    for (int w = 0; w < kWarps; ++w) aggregate += sh.warp_sum[w];
    const unsigned long long target = static_cast<unsigned long long>(u * static_cast<double>(aggregate));
    int owner = -1;
    unsigned long long base = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (target < base + sh.warp_sum[w]) {
        owner = w;
        break;
      }
      base += sh.warp_sum[w];
    }
    int64_t from = 0;
    if (owner >= 0) {
      const int64_t olo = min(V, owner * seg);
      from = olo;
      if (tiles_fit) {  // the owner's tile that holds the target
        for (int tt = 0; olo + 128 * tt < min(V, olo + seg); ++tt) {
          const unsigned long long ts = sh.big.tile_sum[owner][tt];
          if (target < base + ts) break;
          base += ts;
          from += 128;
        }
      }
    }
    sh.i = owner;
    sh.u = base;
    sh.ll = from;
    sh.hist[0] = target;
    sh.token = -1;
  }
  __syncthreads();
  const int owner = sh.i;
  if (warp == owner) {
    const unsigned long long target = sh.hist[0];
    unsigned long long base = sh.u;
    for (int64_t i0 = sh.ll; i0 < hi; i0 += 128) {
      const int64_t i = i0 + 4 * lane;
      unsigned long long w[4];
      w4(i, w);
      const unsigned long long part = w[0] + w[1] + w[2] + w[3];
      unsigned long long incl = part;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const unsigned long long end = base + __shfl_sync(0xffffffffu, incl, 31);
      if (target < end) {
        unsigned long long acc = base + incl - part;
        if (target >= acc && target < acc + part) {
          for (int e = 0; e < 4; ++e) {
            acc += w[e];
            if (acc > target) {
              sh.token = static_cast<int>(i + e);
              break;
            }
          }
        }
        break;
      }
      base = end;
    }
  }
  __syncthreads();
  const int token = sh.token;
  __syncthreads();
  return token;
}

// The bucket of a logit l in a row whose maximum is m: floor((m - l) *
// kBucketScale), monotone in l; NaN, -inf and everything further down than
// the buckets reach go to the last one.
__device__ __forceinline__ int bucket_of(float m, float l) {
  const float t = (m - l) * kBucketScale;
  return t < static_cast<float>(kBuckets - 1) ? static_cast<int>(t) : kBuckets - 1;
}

// Puts every token of the row with want(l, id, valid) on the list, as
// entry(l, id) makes it (entry runs only for the first kListMax, in no
// particular order: the callers sort). Returns how many wanted tokens
// there are (more than kListMax: the list is not usable). One shared
// atomic per wanted token: lists are short where they are used (a
// warp-combined append, a ballot per step, was 10-20 us slower at 100 rows).
template <class Want, class Entry>
__device__ int collect_list(Shared& sh, const float* x, int64_t V, Want want, Entry entry) {
  if (threadIdx.x == 0) sh.i = 0;
  __syncthreads();
  for_each_uniform(x, V, [&](float l, int64_t id, bool valid) {
    if (!want(l, id, valid)) return;
    const int slot = atomicAdd(&sh.i, 1);
    if (slot < kListMax) sh.big.list[slot] = entry(l, id);
  });
  __syncthreads();
  const int n = sh.i;
  __syncthreads();
  return n;
}

// The first bucket (of (max - x), up to the last one) where the count of
// finite tokens from the top reaches n; -1 when none does or more than
// kListMax tokens lie in the buckets up to it.
__device__ int best_buckets_holding(Shared& sh, const float* x, int64_t V, float m, int n) {
  for (int b = threadIdx.x; b < kBuckets; b += kThreads) sh.big.bucket_count[b] = 0;
  __syncthreads();
  for_each_uniform(x, V, [&](float l, int64_t, bool valid) {
    const int b = bucket_of(m, l);
    if (valid && b < kBuckets - 1) atomicAdd(&sh.big.bucket_count[b], 1u);
  });
  __syncthreads();
  if (threadIdx.x == 0) {
    int cum = 0, last = -1;
    for (int b = 0; b < kBuckets - 1; ++b) {
      cum += static_cast<int>(sh.big.bucket_count[b]);
      if (cum >= n) {
        last = b;
        break;
      }
    }
    sh.i = (last < 0 || cum > kListMax) ? -1 : last;
  }
  __syncthreads();
  const int last = sh.i;
  __syncthreads();
  return last;
}

// The list entry of a kept token: its fixed weight, key and id.
__device__ __forceinline__ ListEntry kept_entry(const Dist& d, float l, int64_t id) {
  return ListEntry{d.fixed(l), order_key(l), static_cast<int>(id)};
}

// Puts the positive tokens of buckets 0..last on the list (collect_list's return).
__device__ int list_best_buckets(Shared& sh, const Dist& d, int64_t V, int last) {
  const float m = d.m;
  return collect_list(
      sh, d.x, V, [&](float l, int64_t, bool valid) { return valid && bucket_of(m, l) <= last && d.positive(l); },
      [&](float l, int64_t id) { return kept_entry(d, l, id); });
}

// Top-k with top_k <= kListMax: the tokens of the best buckets (floor((max
// - x) * kBucketScale), monotone in x) up to the first bucket where the
// count from the top reaches top_k hold every token of the top_k largest
// keys, ties at the cut included; they go to the list (positive ones only),
// sorted by key (ties in id order), and the first top_k stay. Returns the
// kept count, or -1 when that needs more than kListMax entries (many equal
// logits) or too few finite tokens lie within the buckets: the caller then
// takes the radix path.
__device__ int top_k_list(Shared& sh, const Dist& d, int64_t V, int top_k) {
  const int last = best_buckets_holding(sh, d.x, V, d.m, top_k);
  if (last < 0) return -1;
  const int n = min(list_best_buckets(sh, d, V, last), kListMax);  // <= kListMax: counted above
  sort_list(sh, n, by_key_desc);
  return min(n, top_k);
}

// Top-p without a top-k cut: the kept mass per bucket of (max - x) (as
// top_k_list's buckets, up to the bucket `far` where the weights fall below
// e^-16; the tokens further down are only summed) and in all gives the
// bucket where the mass from the top reaches top_p * total; every token of
// that bucket and the better ones goes to the list (the cut lies among
// them: the better buckets' keys all stay, the worse ones' all go), with
// the row's total for list_draw. Returns the list's length, or -1 when it
// would exceed kListMax or the cut lies at or past `far`; cut_lo..cut_hi
// (buckets) and above (the mass of the better buckets) then tell the radix
// where the cut lies.
__device__ int top_p_list(Shared& sh, const Dist& d, int64_t V, float top_p, unsigned long long& total, int& cut_lo,
                          int& cut_hi, unsigned long long& above) {
  const double t_max = 16.0 / d.inv_t * static_cast<double>(kBucketScale);
  const int far = t_max >= kBuckets - 1 ? kBuckets - 1 : max(1, static_cast<int>(t_max));
  for (int b = threadIdx.x; b < kBuckets; b += kThreads) sh.big.bucket.mass[b] = 0;
  __syncthreads();
  const float m = d.m;
  unsigned long long mine = 0;
  for_each_uniform(d.x, V, [&](float l, int64_t, bool valid) {
    if (!valid || !d.positive(l)) return;
    const unsigned long long w = d.fixed(l);
    mine += w;
    const int b = bucket_of(m, l);
    if (b < far && w) atomicAdd(&sh.big.bucket.mass[b], w);
  });
  total = block_sum<unsigned long long, ReduceU>(sh.tmp.u, &sh.u, mine);
  if (threadIdx.x == 0) {
    const double target = static_cast<double>(top_p) * static_cast<double>(total);
    unsigned long long cum = 0, before = 0;
    int last = far;  // `far`: the cut lies among the tokens further down
    for (int b = 0; b < far; ++b) {
      before = cum;
      cum += sh.big.bucket.mass[b];
      if (static_cast<double>(cum) >= target) {
        last = b;
        break;
      }
    }
    if (last == far) before = cum;
    sh.i = last;
    sh.ll = static_cast<long long>(before);
  }
  __syncthreads();
  const int last = sh.i;
  cut_lo = last;
  cut_hi = last == far ? INT_MAX : last;
  above = static_cast<unsigned long long>(sh.ll);
  __syncthreads();
  if (last == far) return -1;
  const int n = list_best_buckets(sh, d, V, last);
  return n <= kListMax ? n : -1;
}

// Appends every kept token (id, key, fixed weight) to the list; false when
// more than kListMax are kept (the list is then not usable). count is the
// number kept (from an earlier pass).
__device__ bool build_list(Shared& sh, const Dist& d, int64_t V, const Cut& cut, int count) {
  if (count > kListMax) return false;
  collect_list(
      sh, d.x, V, [&](float l, int64_t id, bool valid) { return valid && d.positive(l) && cut.keeps(order_key(l), id); },
      [&](float l, int64_t id) { return kept_entry(d, l, id); });
  return true;
}

__device__ int count_kept(Shared& sh, const Dist& d, int64_t V, const Cut& cut) {
  int mine = 0;
  for_each_uniform(d.x, V, [&](float l, int64_t id, bool valid) {
    mine += valid && d.positive(l) && cut.keeps(order_key(l), id);
  });
  return block_sum<int, ReduceI>(sh.tmp.i, &sh.i, mine);
}

__device__ int sample_row(Shared& sh, const float* x, int64_t V, const DeviceSampleRow& row) {
  const float m = block_max(sh, x, V);
  if (!isfinite(m)) return greedy_token(sh, x, V);  // nothing finite: greedy, as the host does
  const Dist d{x, m, 1.0 / static_cast<double>(row.temperature),
               row.min_p > 0.0f ? log(static_cast<double>(row.min_p)) : -INFINITY};
  const double u = uniform01(row.seed, row.seq_index, row.position);
  Cut cut;
  const int lane_bin_none = 256;

  if (row.top_k > 0 && row.top_k < V && row.top_k <= kListMax) {
    const int kept = top_k_list(sh, d, V, row.top_k);
    if (kept >= 0) {
      const int token = list_draw(sh, d, kept, row.top_p, u);
      return token >= 0 ? token : greedy_token(sh, x, V);
    }
  }
  if (row.top_k > 0 && row.top_k < V) {
    int mine = 0;
    for_each_uniform(x, V, [&](float l, int64_t, bool valid) { mine += valid && d.positive(l); });
    const int candidates = block_sum<int, ReduceI>(sh.tmp.i, &sh.i, mine);
    if (row.top_k < candidates) {
      // The top_k-th largest key among candidates, 8 bits at a time.
      uint32_t prefix = 0, mask = 0;
      int remaining = row.top_k;
      for (int shift = 24; shift >= 0; shift -= 8) {
        clear_whist(sh);
        for_each_uniform(x, V, [&](float l, int64_t, bool valid) {
          const uint32_t k = order_key(l);
          const bool in = valid && (k & mask) == prefix && d.positive(l);
          warp_count(sh, in ? static_cast<int>((k >> shift) & 255u) : lane_bin_none, 1u);
        });
        merge_whist(sh);
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
      cut.tie_limit = tie_limit_id(sh, d, V, prefix, remaining);
    }
  }

  // A small kept set (a top-k cut, min-p): top-p and the draw on the list.
  if (row.top_k > 0 || row.min_p > 0.0f) {
    const int kept = count_kept(sh, d, V, cut);
    if (build_list(sh, d, V, cut, kept)) {
      const int token = list_draw(sh, d, kept, row.top_p, u);
      return token >= 0 ? token : greedy_token(sh, x, V);
    }
  }

  // The top-p cut's buckets (cut_lo < 0: not known) and the kept mass above them.
  int cut_lo = -1, cut_hi = -1;
  unsigned long long bucket_above = 0, bucket_total = 0;
  if (row.top_p < 1.0f && cut.key == 0) {
    const int n = top_p_list(sh, d, V, row.top_p, bucket_total, cut_lo, cut_hi, bucket_above);
    if (n >= 0) {
      const int token = list_draw(sh, d, n, row.top_p, u, bucket_total);
      return token >= 0 ? token : greedy_token(sh, x, V);
    }
  }
  if (row.top_p < 1.0f) {
    // Radix select on the kept mass, 8 bits of the key at a time (the first
    // pass also gives the total); after top_p_list, over the tokens of the
    // cut's bucket only, the mass of the better buckets counted as above.
    uint32_t prefix = 0, mask = 0;
    unsigned long long above = cut_lo >= 0 ? bucket_above : 0;
    double target = 0.0;
    const float m = d.m;
    auto in_cut_bucket = [&](float l) {
      if (cut_lo < 0) return true;
      const int b = bucket_of(m, l);
      return b >= cut_lo && b <= cut_hi;
    };
    for (int shift = 24; shift >= 0; shift -= 8) {
      clear_whist(sh);
      for_each_uniform(x, V, [&](float l, int64_t id, bool valid) {
        const uint32_t k = order_key(l);
        if (!valid || (k & mask) != prefix || !cut.keeps(k, id) || !in_cut_bucket(l)) return;
        const unsigned long long w = d.fixed(l);
        if (w) atomicAdd(&sh.big.whist[threadIdx.x >> 5][(k >> shift) & 255u], w);
      });
      merge_whist(sh);
      if (threadIdx.x == 0) {
        if (shift == 24) {
          unsigned long long total = 0;
          for (int b = 0; b < 256; ++b) total += sh.hist[b];
          if (cut_lo >= 0) total = bucket_total;
          sh.d = static_cast<double>(row.top_p) * static_cast<double>(total);
        }
        const double t = sh.d;
        int sel = -1, last_nonzero = 0;
        for (int b = 255; b >= 0; --b) {
          if (static_cast<double>(above + sh.hist[b]) >= t) {
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
      target = sh.d;
      mask |= 255u << shift;
      __syncthreads();
    }
    const long long keep = top_p_keep(d, prefix, above, target);
    if (prefix == cut.key) {
      // Both cuts at one key: the fewer ties (in id order) stay.
      const long long limit = tie_limit_id(sh, d, V, prefix, keep);
      cut.tie_limit = min(cut.tie_limit, limit);
    } else {
      cut.key = prefix;
      cut.tie_limit = tie_limit_id(sh, d, V, prefix, keep);
    }
    const int kept2 = count_kept(sh, d, V, cut);
    if (build_list(sh, d, V, cut, kept2)) {
      const int token = list_draw(sh, d, kept2, 1.0f, u);
      return token >= 0 ? token : greedy_token(sh, x, V);
    }
  }
  const int token = vocab_draw(sh, d, V, cut, u);
  return token >= 0 ? token : greedy_token(sh, x, V);
}

// Top logprobs: the tokens of the best buckets of (max - x), up to the
// first bucket where n tokens are reached, sorted by value (descending,
// -0 equal to +0) and id: list[0, n) are the n best by (value desc, id
// asc), as n arg-max passes would give. Returns the list's length, or -1
// (no finite maximum, fewer than n tokens within the buckets, or more than
// kListMax in them): the caller takes the arg-max passes.
__device__ int top_logprob_list(Shared& sh, const float* x, int64_t V, float m, int n) {
  if (!isfinite(m)) return -1;
  const int last = best_buckets_holding(sh, x, V, m, n);
  if (last < 0) return -1;
  const int len = min(collect_list(
                          sh, x, V, [&](float l, int64_t, bool valid) { return valid && bucket_of(m, l) <= last; },
                          [&](float l, int64_t id) {
                            return ListEntry{0, order_key(l == 0.0f ? 0.0f : l), static_cast<int>(id)};
                          }),
                      kListMax);
  sort_list(sh, len, by_key_desc);
  return len;
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

  // Logprobs of the raw row: the log-sum-exp (float exps, double sums) and
  // the rank in one pass.
  const float m = block_max(sh, raw, V);
  const float lt = raw[token];
  const bool finite_max = isfinite(m);
  double part = 0.0;
  int higher = 0;
  for_each_uniform(raw, V, [&](float v, int64_t, bool valid) {
    if (!valid) return;
    if (finite_max) part += static_cast<double>(expf(v - m));
    higher += v > lt;
  });
  double lse = m;
  if (finite_max) lse = static_cast<double>(m) + log(block_sum<double, ReduceD>(sh.tmp.d, &sh.d, part));
  const int rank = 1 + block_sum<int, ReduceI>(sh.tmp.i, &sh.i, higher);
  float* top_lp = a.top_logprobs + static_cast<int64_t>(blockIdx.x) * kMaxDeviceTopLogprobs;
  int32_t* top_id = a.top_ids + static_cast<int64_t>(blockIdx.x) * kMaxDeviceTopLogprobs;
  const int n = static_cast<int>(min(static_cast<int64_t>(min(row.num_logprobs, kMaxDeviceTopLogprobs)), V));
  // The top n by (value desc, id asc): from the list of the best buckets,
  // else one arg-max pass per entry.
  const int listed = n > 0 ? top_logprob_list(sh, raw, V, m, n) : 0;
  Best prev{0.0f, -1};
  for (int j = 0; j < kMaxDeviceTopLogprobs; ++j) {
    if (j < n) {
      if (listed >= n) {
        prev = Best{raw[sh.big.list[j].id], sh.big.list[j].id};
      } else {
        prev = block_best(sh, raw, V, prev.v, prev.i);
      }
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
