// Hopper prefill attention on warpgroup MMA (prefill_wgmma.cu): the kernel
// launch_prefill_attention (prefill_attention.cu) takes on sm_90 devices for
// the shapes it covers; the mma.sync kernel (prefill_attention_mma.cu) keeps
// every other case. OSPREY_PREFILL_WGMMA=0 forces the mma.sync kernel.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace osprey::cuda {

// True when this build carries sm_90a code (CMAKE_CUDA_ARCHITECTURES names
// 90a) and the current device is compute capability 9.0.
bool prefill_wgmma_available();

// The shapes the wgmma kernel covers: prefill_attention_supported(a),
// BF16 or F16, head_dim 128, no sliding window, scale > 0, out 16-byte
// aligned. (head_dim 64, windows and the rest stay on the mma.sync kernel.)
bool prefill_wgmma_supports(const PagedAttentionArgs& a);

// Kernel variants (all compute the same function): 0 the default (below);
// 1: two warpgroups of 64 rows that also gather K/V (cp.async, block
// barrier per key tile), P_{t-1} V_{t-1} issued right after S_t; 4: 1 with
// P_{t-1} V_{t-1} issued after the copies of tile t (by then the other
// warpgroup's S_t is usually queued too, so both S products tend to run
// before either P V); 2: warp-specialised, one
// warpgroup gathering K and V tiles into a six-slot mbarrier ring (full /
// empty per slot, arrivals by cp.async.mbarrier.arrive, up to two tiles
// ahead) for two computing warpgroups that never wait for each other;
// 3: 2 with the computing warpgroups taking turns to issue their wgmma;
// 5: 3 as a persistent kernel (one block per SM walking the work tiles,
// two Q buffers, so one tile's start and end overlap its neighbours').
// On an H100 (2026-11-26, causal, 32 q / 8 KV heads of 128, bf16, one
// call, gpu_tests' PrefillAttentionBench): variant 4 201 / 291 / 366 / 406
// TFLOP/s at 1k / 2k / 4k / 8k tokens, variant 1 195 / 271 / 340 / 382,
// variant 2 195 / 286 / 357 / 398, variant 3 199 / 287 / 360 / 403.
constexpr int kNumPrefillWgmmaVariants = 6;
constexpr int kPrefillWgmmaDefaultVariant = 3;

// Preconditions: prefill_wgmma_available(), prefill_wgmma_supports(a), at
// least one query token. Computes the same function as
// launch_prefill_attention_mma.
void launch_prefill_attention_wgmma(const PagedAttentionArgs& a, cudaStream_t stream, int variant = 0);

}  // namespace osprey::cuda
