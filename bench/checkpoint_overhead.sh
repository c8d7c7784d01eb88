#!/usr/bin/env bash
# What a checkpoint costs the training loop: the same run without checkpoints (only the final one), with a
# synchronous save every EVERY steps, and with an asynchronous one (written by a background thread, committed
# a step later). Prints the mean time per step including the time the loop spent on checkpoints.
#   make bench-checkpoint          SHAPE="layers heads width context" STEPS=60 EVERY=10 NPROC=2 ZERO=0
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/crosstrain}
read -r LAYERS HEADS WIDTH CONTEXT <<< "${SHAPE:-6 6 384 128}"
STEPS=${STEPS:-60}; EVERY=${EVERY:-10}; NPROC=${NPROC:-2}; ZERO=${ZERO:-0}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "# GPT ${LAYERS}L ${HEADS}H d${WIDTH} T${CONTEXT}, $NPROC ranks, zero=$ZERO, $STEPS steps, checkpoint every $EVERY"
# blocking_pct: time the loop spent in checkpoint calls over its compute time (the direct cost);
# vs_none_pct: the whole step time against the run without checkpoints (includes the background writer's
# competition for the cores, and this shared machine's noise).
printf "%-8s %10s %20s %13s %12s %10s\n" mode step_ms checkpoint_ms_total blocking_pct vs_none_pct ckpt_MiB
base=""
for mode in none sync async; do
  every=$EVERY; async=false
  [ "$mode" = none ] && every=0
  [ "$mode" = async ] && async=true
  dir="$tmp/$mode"
  "$BIN" train recipes/gpt-tiny.toml --nproc "$NPROC" --set run.dir="$dir" --set parallel.zero="$ZERO" \
    --set model.n_layer="$LAYERS" --set model.n_head="$HEADS" --set model.n_embd="$WIDTH" \
    --set model.block_size="$CONTEXT" --set train.global_batch=8 --set train.steps="$STEPS" \
    --set train.checkpoint_every="$every" --set train.async_checkpoint="$async" --set train.keep_checkpoints=2 \
    --set train.eval_every=0 --set train.sample_tokens=0 > "$dir.log" 2>&1 ||
    { echo "$mode failed:"; tail -3 "$dir.log"; exit 1; }
  size=$(du -sm "$(ls -d "$dir"/checkpoints/step_* | tail -1)" | cut -f1)
  base=$(/usr/bin/python3 - "$dir/metrics.jsonl" "$mode" "$base" "$size" "$STEPS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][:-1]  # the final save is the same in every mode
per_step = sum(r["step_time_s"] + r.get("checkpoint_s", 0) for r in rows) / len(rows)
ckpt = sum(r.get("checkpoint_s", 0) for r in rows)
compute = sum(r["step_time_s"] for r in rows)
base = float(sys.argv[3]) if sys.argv[3] else per_step
print("%-8s %10.1f %20.1f %13.2f %12.1f %10s" % (sys.argv[2], 1000 * per_step, 1000 * ckpt, 100 * ckpt / compute,
      100 * (per_step / base - 1), sys.argv[4]), file=sys.stderr)
print(base)
PY
)
done 2>&1
