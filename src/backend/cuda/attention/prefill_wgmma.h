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

// The shapes some variant of the wgmma kernel covers:
// prefill_attention_supported(a), BF16 or F16 q and out, pages of that type,
// F8_E4M3 or I8 (with row scales), head_dim 128 or 64, any sliding window,
// scale > 0, out 16-byte aligned. (The rest stays on the mma.sync kernel.)
bool prefill_wgmma_supports(const PagedAttentionArgs& a);
// prefill_wgmma_supports(a) and `variant` (below; 0: the default) built for
// a's pages, head_dim and window: one-byte pages, head_dim 64 and sliding
// windows only in the warp-specialised variants 2 and 3.
bool prefill_wgmma_supports(const PagedAttentionArgs& a, int variant);

// Kernel variants (all compute the same function): 0 the default (3);
// 1: two warpgroups of 64 rows that also gather K/V (cp.async, block
// barrier per key tile), P_{t-1} V_{t-1} issued right after S_t; 4: 1 with
// P_{t-1} V_{t-1} issued after the copies of tile t (by then the other
// warpgroup's S_t is usually queued too, so both S products tend to run
// before either P V); 2: warp-specialised, one
// warpgroup gathering K and V tiles into a six-slot mbarrier ring (full /
// empty per slot, arrivals by cp.async.mbarrier.arrive, up to two tiles
// ahead) for two computing warpgroups that never wait for each other;
// 3: 2 with the computing warpgroups taking turns to issue their wgmma.
// On an H200 (2026-11-27, causal, 32 q / 8 KV heads of 128, bf16, one
// call, gpu_tests' PrefillAttentionBench): variant 3 250 / 363 / 451 / 507
// TFLOP/s at 1k / 2k / 4k / 8k tokens, variant 2 243 / 359 / 456 / 523,
// variant 4 215 / 301 / 369 / 409, variant 1 201 / 268 / 325 / 361. (Until
// the copying warpgroup loaded its page-table entries together, variants
// 2 and 3 waited for them one key at a time and ran at 286 / 357 on an
// H100 at 2k / 4k; variant 4 was the default.)
constexpr int kNumPrefillWgmmaVariants = 5;
constexpr int kPrefillWgmmaDefaultVariant = 3;

// Whether `variant` (0: the default) copies a's K/V tiles with the bulk
// tensor copy engine (TMA) rather than with cp.async: the warp-specialised
// variants 2 and 3 can over pages of the 16-bit type whose size is a power
// of two >= 8 (where the driver encodes tensor maps), and do so wherever
// they can (faster at every shape measured on an H200, session 28);
// OSPREY_PREFILL_TMA=0 never takes it.
bool prefill_wgmma_uses_tma(const PagedAttentionArgs& a, int variant = 0);

// Whether the warp-specialised variants bring a's q tile with the bulk
// tensor copy engine (one box a 64-element panel, the block barrier not
// waiting for it) rather than with every thread's cp.async: where G = hq /
// hk divides the 128 rows of a block, q is 16-byte aligned and the driver
// encodes the tensor map; OSPREY_PREFILL_TMA_Q=0 never does.
bool prefill_wgmma_q_tma(const PagedAttentionArgs& a);

// Preconditions: prefill_wgmma_available(), prefill_wgmma_supports(a,
// variant). Computes the same function as
// launch_prefill_attention_mma.
void launch_prefill_attention_wgmma(const PagedAttentionArgs& a, cudaStream_t stream, int variant = 0);

}  // namespace osprey::cuda
