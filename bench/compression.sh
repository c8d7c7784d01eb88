#!/usr/bin/env bash
# make bench-compression: per gradient codec, the bytes one rank sends per step and the loss after a fixed
# number of steps, next to uncompressed training (gpt-tiny, 2 ranks); then the byte ratios on gpt-small's gradients.
#   STEPS=200 CODECS="none bf16 int8 int4 topk:0.01 powersgd:4"
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/crosstrain}
STEPS=${STEPS:-200}
CODECS=${CODECS:-"none bf16 int8 int4 topk:0.01 powersgd:4"}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "# gpt-tiny, 2 ranks, ${STEPS} steps, same seed and data; bytes = sent by one rank per step (busbw accounting)"
printf "%-12s %14s %14s %8s %10s %10s\n" codec bytes_per_step uncompressed ratio loss vs_none
base=""
for codec in $CODECS; do
  dir="$tmp/${codec//[:.]/_}"
  "$BIN" train recipes/gpt-tiny.toml --nproc 2 --set run.dir="$dir" --set train.steps="$STEPS" \
    --set comm.compression="$codec" --set train.eval_every=0 --set train.sample_tokens=0 \
    --set train.checkpoint_every=0 --set run.log_every=100000 > "$dir.log" 2>&1 || { tail -3 "$dir.log"; exit 1; }
  line=$(/usr/bin/python3 - "$dir/metrics.jsonl" "$codec" "$base" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
last = rows[-1]
# The loss of the last 10 steps, averaged: one step's loss is noisy.
loss = sum(r["loss"] for r in rows[-10:]) / len(rows[-10:])
base = float(sys.argv[3]) if sys.argv[3] else loss
print("%-12s %14d %14d %8.2f %10.4f %+9.2f%%" % (sys.argv[2], last["comm_bytes"], last["comm_bytes_uncompressed"],
      last["comm_bytes_uncompressed"] / max(last["comm_bytes"], 1), loss, 100 * (loss - base) / base))
PY
)
  echo "$line"
  [ -z "$base" ] && base=$(echo "$line" | awk '{print $5}')
done
echo "# gpt-small gradients (10.7M parameters), 2 ranks, one step"
for codec in int8 powersgd:4; do
  dir="$tmp/small_${codec//[:.]/_}"
  "$BIN" train recipes/gpt-small.toml --nproc 2 --set run.dir="$dir" --set train.steps=1 --set train.global_batch=2 \
    --set comm.compression="$codec" --set train.eval_every=0 --set train.sample_tokens=0 --set run.log_every=100000 \
    --set train.checkpoint_every=0 > "$dir.log" 2>&1 || { tail -3 "$dir.log"; exit 1; }
  /usr/bin/python3 -c "
import json; r=[json.loads(l) for l in open('$dir/metrics.jsonl')][-1]
print('gpt_small_%s_bytes_ratio=%.2f' % ('$codec', r['comm_bytes_uncompressed'] / r['comm_bytes']))"
done
