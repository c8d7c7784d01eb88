#!/usr/bin/env bash
# Memory of rank 0 (pipeline stage 0, tensor-parallel rank 0) for each 4-rank layout of a GPT: the bytes of its
# parameter shards and its peak resident memory (parameters, gradients, AdamW state, activations, libraries).
#   make bench-memory-layouts          SHAPE="layers heads width context" BATCH=global batch
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/crosstrain}
read -r LAYERS HEADS WIDTH CONTEXT <<< "${SHAPE:-8 8 256 128}"
BATCH=${BATCH:-16}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "# GPT ${LAYERS}L ${HEADS}H d${WIDTH} T${CONTEXT}, global batch ${BATCH}, 4 ranks, 3 steps; rank 0's memory"
printf "%-22s %14s %14s\n" "layout" "params_MB" "peak_rss_MB"
for layout in "4 1 1" "1 4 1" "1 1 4" "2 2 1" "2 1 2" "1 2 2"; do
  read -r DP PP TP <<< "$layout"
  dir="$tmp/dp${DP}pp${PP}tp${TP}"
  "$BIN" train recipes/gpt-tiny.toml --nproc 4 --set run.dir="$dir" --set parallel.dp="$DP" --set parallel.pp="$PP" \
    --set parallel.tp="$TP" --set model.n_layer="$LAYERS" --set model.n_head="$HEADS" --set model.n_embd="$WIDTH" \
    --set model.block_size="$CONTEXT" --set train.global_batch="$BATCH" --set train.steps=3 \
    --set train.eval_every=0 --set train.sample_tokens=0 --set train.checkpoint_every=0 > "$dir.log" 2>&1 ||
    { echo "layout dp=$DP pp=$PP tp=$TP failed:"; tail -3 "$dir.log"; exit 1; }
  /usr/bin/python3 - "$dir/metrics.jsonl" "dp=$DP pp=$PP tp=$TP" <<'PY'
import json, sys
row = [json.loads(l) for l in open(sys.argv[1])][-1]
print("%-22s %14.2f %14.1f" % (sys.argv[2], row["param_bytes"] / 2**20, row["peak_rss_bytes"] / 2**20))
PY
done
