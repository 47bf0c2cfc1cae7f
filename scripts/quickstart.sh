#!/usr/bin/env bash
# Installs what osprey needs, builds it, fetches the default model and asks it
# one chat question; the answer streams to the terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh -DOSPREY_TESTS=OFF
./scripts/fetch_model.sh
exec ./build/tools/osprey generate --model default --chat \
  --prompt "${1:-What is the capital of France? Answer in one sentence.}" --max-tokens 128
