// Rotary embedding, Hugging Face half-rotation layout, fp32 like torch:
// angle = position * inv_freq[i] rounded to fp32, cos/sin at full accuracy.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

// One block per token; threads stride over (head, i) pairs of q then k.
template <class T>
__global__ void rope_kernel(T* __restrict__ q, T* __restrict__ k, const int32_t* __restrict__ positions, int hq, int hk,
                            int hd, const float* __restrict__ inv_freq, int half, float scaling) {
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(positions[t]);
  const int total = (hq + hk) * half;
  for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int head = idx / half;
    const int i = idx - head * half;
    T* x = head < hq ? q + (t * hq + head) * hd : k + (t * hk + (head - hq)) * hd;
    const float angle = pos * inv_freq[i];
    const float c = cosf(angle) * scaling;
    const float s = sinf(angle) * scaling;
    const float x1 = to_float(x[i]);
    const float x2 = to_float(x[i + half]);
    // Each product rounded separately, as q * cos + rotate_half(q) * sin is in torch.
    const float a1 = __fmul_rn(x1, c), b1 = __fmul_rn(x2, s);
    const float a2 = __fmul_rn(x2, c), b2 = __fmul_rn(x1, s);
    x[i] = from_float<T>(a1 - b1);
    x[i + half] = from_float<T>(a2 + b2);
  }
}

}  // namespace

void launch_rope(DType act, void* q, void* k, const int32_t* positions, int64_t n, int hq, int hk, int hd,
                 const float* inv_freq, int rotary_dim, float attention_scaling, cudaStream_t stream) {
  if (n == 0) return;
  OSP_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= hd);
  OSP_CHECK_LE(n, int64_t{2147483647});
  const int half = rotary_dim / 2;
  const int threads = static_cast<int>(std::clamp<int64_t>(ceil_div(int64_t{hq + hk} * half, 32) * 32, 32, 256));
  OSP_DISPATCH_ACT(act, T,
                   rope_kernel<T><<<static_cast<unsigned>(n), threads, 0, stream>>>(
                       static_cast<T*>(q), static_cast<T*>(k), positions, hq, hk, hd, inv_freq, half,
                       attention_scaling));
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
