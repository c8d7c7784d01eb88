#!/usr/bin/env bash
# make bench-scale (bench/scale.py): a ~370M-parameter GPT on 4 ranks against one process; recompute full vs none.
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 bench/scale.py --bin "${BIN:-build/crosstrain}" "$@"
