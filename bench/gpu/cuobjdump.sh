#!/usr/bin/env bash
# Fetches cuobjdump and nvdisasm (NVIDIA's wheels on PyPI, pinned) into
# ~/.cache/osprey/tools/cuda-binutils/bin and prints that folder: the CUDA
# toolkit on the dev VM has nvcc and ptxas but not these. Static SASS of a
# kernel, without a GPU (docs/bench.md):
#   nvcc -DOSPREY_HAVE_CUDA=1 -DOSPREY_CUDA_SM90A=1 -Isrc -Iinclude -O3 -DNDEBUG --expt-relaxed-constexpr \
#       -std=c++17 -arch=sm_90a -cubin src/backend/cuda/attention/decode_attention.cu -o /tmp/d.cubin
#   "$(bench/gpu/cuobjdump.sh)/cuobjdump" -sass /tmp/d.cubin > /tmp/d.sass
#   bench/gpu/sass_loops.py /tmp/d.sass --kernel mma_decode_kernelILi128E13__nv_bfloat16
set -euo pipefail
version=13.5.37
dest=${OSPREY_TOOLS_DIR:-$HOME/.cache/osprey/tools}/cuda-binutils-$version
if [[ ! -x $dest/bin/cuobjdump || ! -x $dest/bin/nvdisasm ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
    "nvidia-cuda-cuobjdump==$version" "nvidia-cuda-nvdisasm==$version" >&2
  mkdir -p "$dest/bin"
  for w in "$tmp"/*.whl; do
    python3 -m zipfile -e "$w" "$tmp/x" >&2
  done
  for tool in cuobjdump nvdisasm; do
    install -m 755 "$(find "$tmp/x" -type f -name "$tool" | head -1)" "$dest/bin/$tool"
  done
fi
echo "$dest/bin"
