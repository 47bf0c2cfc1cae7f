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
// barrier per key tile); 2: warp-specialised, one warpgroup gathering K/V
// into a three-stage mbarrier ring for two computing warpgroups; 3: 2 with
// the computing warpgroups taking turns to issue their wgmma. On an H100
// (2026-11-26, causal, 32 q / 8 KV heads of 128, bf16) variant 1 measured
// 204 / 276 / 339 / 373 TFLOP/s at 1k / 2k / 4k / 8k tokens, variant 2
// 183 / 238 / 274 / 292 and variant 3 191 / 250 / 289 / 312: their copying
// warpgroup signals a stage only after issuing the next one, about one tile
// of look-ahead.
constexpr int kNumPrefillWgmmaVariants = 4;
constexpr int kPrefillWgmmaDefaultVariant = 1;

// Preconditions: prefill_wgmma_available(), prefill_wgmma_supports(a), at
// least one query token. Computes the same function as
// launch_prefill_attention_mma.
void launch_prefill_attention_wgmma(const PagedAttentionArgs& a, cudaStream_t stream, int variant = 0);

}  // namespace osprey::cuda
