#!/usr/bin/env bash
# make bench-ddp: crosstrain against PyTorch's DistributedDataParallel on the same GPT shape, the same batch,
# 2 ranks with one compute thread each, over Gloo. Runs alternate (PyTorch, crosstrain, PyTorch, ...) so that
# the shared machine's noise hits both; the ratio is of the mean tokens/s.
#   SHAPE="layers heads width context" BATCH (per rank) STEPS ROUNDS can be overridden from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/crosstrain}
read -r LAYERS HEADS WIDTH CONTEXT <<< "${SHAPE:-4 4 128 128}"
BATCH=${BATCH:-8}
NPROC=${NPROC:-2}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-3}
ROUNDS=${ROUNDS:-3}
PY=/usr/bin/python3
if ! $PY -c 'import torch' 2>/dev/null; then
  echo "bench-ddp needs Debian's python3-torch (scripts/install-deps.sh python3-torch)" >&2
  exit 1
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "# bench-ddp: GPT ${LAYERS}L ${HEADS}H d${WIDTH} T${CONTEXT}, ${BATCH} sequences per rank, ${NPROC} ranks, 1 thread each"
echo "# PyTorch: DDP over Gloo (defaults); crosstrain: bucketed reducer over Gloo with the same-host shared-memory all-reduce"
echo "# (comm.shared_memory; run with SHM=false to compare Gloo alone)"
echo "# ${WARMUP} warm-up + ${STEPS} timed steps per run, ${ROUNDS} rounds"
pt_all=(); ct_all=()
for round in $(seq 1 "$ROUNDS"); do
  pt=$($PY bench/ddp_pytorch.py --nproc "$NPROC" --layers "$LAYERS" --heads "$HEADS" --width "$WIDTH" \
        --context "$CONTEXT" --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" | sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
  dir="$tmp/ct$round"
  "$BIN" train recipes/gpt-tiny.toml --nproc "$NPROC" --set run.dir="$dir" \
    --set model.n_layer="$LAYERS" --set model.n_head="$HEADS" --set model.n_embd="$WIDTH" \
    --set model.block_size="$CONTEXT" --set train.global_batch=$((BATCH * NPROC)) \
    --set train.steps=$((WARMUP + STEPS)) --set train.eval_every=0 --set train.sample_tokens=0 \
    --set train.checkpoint_every=0 --set run.log_every=1000 --set comm.shared_memory="${SHM:-true}" > "$tmp/ct$round.log"
  # Timed steps only, by wall clock (as the PyTorch side): from the end of the warm-up to the last step.
  ct=$($PY -c "
import json,sys
rows=[json.loads(l) for l in open('$dir/metrics.jsonl')]
timed=rows[$WARMUP:]
tokens=$BATCH*$NPROC*$CONTEXT*len(timed)
print(tokens/(timed[-1]['time_s']-rows[$WARMUP-1]['time_s']))")
  printf "round %d: pytorch_ddp %8.1f tokens/s   crosstrain %8.1f tokens/s\n" "$round" "$pt" "$ct"
  pt_all+=("$pt"); ct_all+=("$ct")
done
$PY - "${pt_all[*]}" "${ct_all[*]}" <<'PYEOF'
import sys
pt = [float(x) for x in sys.argv[1].split()]
ct = [float(x) for x in sys.argv[2].split()]
mp, mc = sum(pt) / len(pt), sum(ct) / len(ct)
print(f"pytorch_ddp_tokens_per_s={mp:.1f}")
print(f"crosstrain_tokens_per_s={mc:.1f}")
print(f"ratio_vs_pytorch={mc / mp:.3f}")
PYEOF
