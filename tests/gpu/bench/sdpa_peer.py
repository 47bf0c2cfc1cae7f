#!/usr/bin/env python3
"""Peer figures for the prefill attention bench (prefill_attention_test.cpp,
DISABLED_PrefillAttentionBench): PyTorch scaled_dot_product_attention on the
same card, one causal prompt of L tokens, bf16, 32 query / 8 KV heads of 128
(Llama-3-8B), for each SDPA backend that runs (flash = FlashAttention-2 in
PyTorch; cudnn where available). TFLOP/s counts causal FLOPs like the osprey
bench: 4 x hq x hd x L (L + 1) / 2. Median of 15 event-timed calls after 3
warm-ups. A benchmark: prints figures, asserts nothing.

Usage: python3 tests/gpu/bench/sdpa_peer.py [L ...]   (default 1024 2048 4096 8192)
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HK, HD = 32, 8, 128


def time_ms(fn, reps=15, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    lens = [int(x) for x in sys.argv[1:]] or [1024, 2048, 4096, 8192]
    dev = torch.device("cuda")
    print(f"sdpa peer on {torch.cuda.get_device_name(0)}, torch {torch.__version__}: causal, bf16, "
          f"hq {HQ}, hk {HK}, hd {HD}")
    print(f"{'tokens':<8} {'backend':<22} {'ms':>10} {'TFLOP/s':>10}")
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    for L in lens:
        g = torch.Generator(device=dev).manual_seed(L)
        q = torch.randn(1, HQ, L, HD, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, HK, L, HD, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, HK, L, HD, device=dev, dtype=torch.bfloat16, generator=g)
        k_rep = k.repeat_interleave(HQ // HK, dim=1)
        v_rep = v.repeat_interleave(HQ // HK, dim=1)
        flops = 4.0 * HQ * HD * L * (L + 1) / 2
        for name, be in backends:
            # GQA natively where the backend takes it, else K/V expanded to 32 heads.
            for label, args, kw in ((name + " gqa", (q, k, v), {"enable_gqa": True}),
                                    (name + " expanded kv", (q, k_rep, v_rep), {})):
                try:
                    with sdpa_kernel(be):
                        fn = lambda: F.scaled_dot_product_attention(*args, is_causal=True, **kw)  # noqa: E731
                        fn()
                        ms = time_ms(fn)
                except RuntimeError as e:  # backend unavailable for these inputs
                    print(f"{L:<8} {label:<22} {'n/a':>10} {'':>10}  ({str(e).splitlines()[0][:80]})")
                    continue
                print(f"{L:<8} {label:<22} {ms:>10.3f} {flops / (ms * 1e-3) / 1e12:>10.1f}")
                break


if __name__ == "__main__":
    main()
