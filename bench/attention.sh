#!/usr/bin/env bash
# Fused causal attention against the dense path (matmul, mask, softmax, matmul), forward + backward, one thread,
# at T = 128, 512, 1024, 2048 (target: fused at least 1.5x faster from T = 1024).
#   make bench-attention          ARGS="--heads 4 --batch 2 --repeat 9"
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/crosstrain}
# shellcheck disable=SC2086
exec "$BIN" bench attention ${ARGS:-}
