#!/usr/bin/env bash
# Model-state bytes per parameter of each ZeRO stage, measured (the buffers rank 0 really holds: parameters,
# gradients, Adam moments) next to the ZeRO formula for fp32 Adam: plain 16, stage 1 8 + 8/N, stage 2 4 + 12/N,
# stage 3 16/N (N data-parallel ranks). Also rank 0's peak RSS, which adds activations and libraries.
#   make bench-memory          SHAPE="layers heads width context"
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/crosstrain}
read -r LAYERS HEADS WIDTH CONTEXT <<< "${SHAPE:-4 4 256 128}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "# GPT ${LAYERS}L ${HEADS}H d${WIDTH} T${CONTEXT}, fp32 AdamW, 3 steps; rank 0's model state"
printf "%-6s %-4s %26s %25s %11s %11s %11s %12s\n" stage dp measured_bytes_per_param formula_bytes_per_param \
  params_MB grads_MB optim_MB peak_rss_MB
for DP in 2 4; do
  for STAGE in 0 1 2 3; do
    dir="$tmp/dp${DP}z${STAGE}"
    "$BIN" train recipes/gpt-tiny.toml --nproc "$DP" --set run.dir="$dir" --set parallel.zero="$STAGE" \
      --set model.n_layer="$LAYERS" --set model.n_head="$HEADS" --set model.n_embd="$WIDTH" \
      --set model.block_size="$CONTEXT" --set train.global_batch=8 --set train.steps=3 \
      --set train.eval_every=0 --set train.sample_tokens=0 --set train.checkpoint_every=0 > "$dir.log" 2>&1 ||
      { echo "stage $STAGE at dp=$DP failed:"; tail -3 "$dir.log"; exit 1; }
    # The parameter count comes from the run's own log line ("crosstrain train: NAME, P parameters, ...").
    PARAMS=$(sed -n 's/.*, \([0-9]*\) parameters,.*/\1/p' "$dir.log" | head -1)
    /usr/bin/python3 - "$dir/metrics.jsonl" "$STAGE" "$DP" "$PARAMS" <<'PY'
import json, sys
row = [json.loads(l) for l in open(sys.argv[1])][-1]
stage, n, params = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
formula = [16, 8 + 8 / n, 4 + 12 / n, 16 / n][stage]
measured = row["model_state_bytes"] / params
mb = lambda key: row[key] / 2**20
print("%-6d %-4d %26.3f %25.3f %11.2f %11.2f %11.2f %12.1f" % (stage, n, measured, formula, mb("param_bytes"),
      mb("grad_bytes"), mb("optimizer_bytes"), mb("peak_rss_bytes")))
PY
  done
done
