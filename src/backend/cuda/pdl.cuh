// Programmatic dependent launch (PDL, compute capability 9.0+): a kernel
// launched through launch_pdl may become resident while the kernel before it
// in the stream is still running, so its prologue (index math, weight loads)
// overlaps the previous kernel's tail, and its launch latency is hidden. CUDA
// graphs captured from such a stream keep the programmatic edges.
//
// Which kernels use it: the decode chain's own (gemm/gemv.cu, norm/,
// elementwise/ embedding, add, SiLU-and-mul) and the attention inputs
// (rope/qkv_rope.cu, then the tensor-core kernel of
// attention/decode_attention.cu, whose pre-wait reads are the K/V of
// positions written by earlier steps; OSPREY_ATTENTION_PDL=0 for A/B). A kernel launched the ordinary
// way after one of them still waits for it to complete, so other kernels
// need no change; they only gain when they adopt the contract below.
//
// Contract of every kernel launched through launch_pdl (a kernel that breaks
// it races with the kernel before it):
//  - before pdl_wait() it reads only memory that no kernel of the stream
//    writes (weights, norm weights, tables) and writes nothing;
//  - every thread calls pdl_wait() before its first other global access and
//    before it may return, so the grid's completion implies the completion
//    (and visible writes) of every grid before it in the stream.
// pdl_wait() blocks until the previous grid has completed and its writes are
// visible; it returns at once when the kernel was launched without the
// attribute. pdl_launch_dependents() lets the next PDL kernel start its
// prologue once every block of this grid has passed it or exited; where it
// sits never affects correctness (the next kernel's pdl_wait still waits for
// this grid's completion), only how early the next grid takes SM slots.
//
// OSPREY_CUDA_NO_PDL=1 in the environment launches everything without the
// attribute (the A/B and debugging switch; docs/cuda.md).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_check.h"

namespace osprey::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Whether launches on the current device get the PDL attribute: compute
// capability >= 9.0, this library's kernels built for sm_90+ (else pdl_wait
// is compiled out) and OSPREY_CUDA_NO_PDL unset or "0". Cached per device.
bool pdl_enabled();

// OSPREY_ATTENTION_PDL=0 leaves out the attention inputs' programmatic
// edges (qkv_rope_kv_write and the decode attention kernel launch the
// ordinary way; A/B switch); the rest of the chain keeps them.
bool attention_pdl_enabled();

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic
// stream serialization attribute where `on` and pdl_enabled(). Checks the
// launch.
template <class... Params, class... Args>
void launch_pdl_if(bool on, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = on && pdl_enabled() ? 1 : 0;
  OSP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// launch_pdl_if(true, ...).
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  launch_pdl_if(true, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace osprey::cuda
