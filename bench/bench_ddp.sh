#!/usr/bin/env bash
# make bench-ddp: crosstrain against PyTorch's DistributedDataParallel on the same GPT shape, the same batch,
# 2 ranks with one compute thread each, over Gloo, in fp32 and in bf16. Runs alternate (PyTorch, crosstrain,
# PyTorch, ...) so that the shared machine's noise hits both; each ratio is of the mean tokens/s.
#   bf16: PyTorch's CPU recipe, the forward under torch.autocast("cpu", dtype=torch.bfloat16) with fp32 weights
#   and gradients, against crosstrain with train.precision = "bf16" (bf16 weights and gradients, fp32 masters).
# Shapes: demo (4 layers, 4 heads, width 128, context 128, 8 sequences per rank) and gpt-small (6 layers,
# 6 heads, width 384, context 256, 4 sequences per rank). Prints one ratio per shape and precision, then
#   ratio_vs_pytorch=       the smallest fp32 ratio over the shapes (target: at least 1.15)
#   ratio_vs_pytorch_bf16=  the smallest bf16 ratio over the shapes (target: at least 1.2)
# From the environment: SHAPE="layers heads width context" (one shape, named custom, instead of both) with
# BATCH (per rank) STEPS WARMUP ROUNDS; SHAPES="demo gpt_small" and PRECISIONS="fp32 bf16" select cases.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/crosstrain}
NPROC=${NPROC:-2}
PY=/usr/bin/python3
if ! $PY -c 'import torch' 2>/dev/null; then
  echo "bench-ddp needs Debian's python3-torch (scripts/install-deps.sh python3-torch)" >&2
  exit 1
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# name -> "layers heads width context batch steps warmup rounds"
declare -A CASES=(
  [demo]="4 4 128 128 ${BATCH:-8} ${STEPS:-20} ${WARMUP:-3} ${ROUNDS:-3}"
  [gpt_small]="6 6 384 256 ${BATCH:-4} ${STEPS:-10} ${WARMUP:-2} ${ROUNDS:-2}"
)
SHAPES=${SHAPES:-demo gpt_small}
if [[ -n "${SHAPE:-}" ]]; then
  CASES[custom]="$SHAPE ${BATCH:-8} ${STEPS:-20} ${WARMUP:-3} ${ROUNDS:-3}"
  SHAPES=custom
fi
PRECISIONS=${PRECISIONS:-fp32 bf16}

echo "# bench-ddp: ${NPROC} ranks, 1 thread each; shapes: ${SHAPES}; precisions: ${PRECISIONS}"
echo "# PyTorch: DDP over Gloo (defaults; bf16 = CPU autocast); crosstrain: bucketed reducer over Gloo with the"
echo "# same-host shared-memory all-reduce (comm.shared_memory; SHM=false compares Gloo alone)"

# One shape and precision: prints the rounds and a `case` line; appends "name precision ratio" to $tmp/ratios.
run_case() {
  local name=$1 precision=$2 L H W T B S WU R
  read -r L H W T B S WU R <<< "${CASES[$name]}"
  local pt_flag="" pt_all=() ct_all=()
  [[ "$precision" == bf16 ]] && pt_flag=--bf16
  echo "# ${name} ${precision}: GPT ${L}L ${H}H d${W} T${T}, ${B} sequences per rank, ${WU} warm-up + ${S} timed steps, ${R} rounds"
  for round in $(seq 1 "$R"); do
    local pt ct dir="$tmp/${name}_${precision}_${round}"
    # PyTorch's run is bounded (--timeout) and tried twice: a rank of it has been seen to hang at start-up.
    for attempt in 1 2; do
      pt=$($PY bench/ddp_pytorch.py --nproc "$NPROC" --layers "$L" --heads "$H" --width "$W" --context "$T" \
            --batch "$B" --steps "$S" --warmup "$WU" --timeout 240 $pt_flag 2>/dev/null |
           sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p') || true
      [[ -n "$pt" ]] && break
      echo "# PyTorch's run failed or timed out (attempt $attempt)" >&2
    done
    [[ -n "$pt" ]] || { echo "bench-ddp: PyTorch's DDP run failed twice" >&2; exit 1; }
    # peak_flops_per_rank given: MFU's GEMM measurement is skipped (it is not timed, but it costs seconds).
    "$BIN" train recipes/gpt-tiny.toml --nproc "$NPROC" --set run.dir="$dir" \
      --set model.n_layer="$L" --set model.n_head="$H" --set model.n_embd="$W" --set model.block_size="$T" \
      --set train.global_batch=$((B * NPROC)) --set train.steps=$((WU + S)) --set train.eval_every=0 \
      --set train.sample_tokens=0 --set train.checkpoint_every=0 --set run.log_every=1000 \
      --set train.precision="$precision" --set train.peak_flops_per_rank=1e11 \
      --set comm.shared_memory="${SHM:-true}" > "$dir.log" 2>&1 || { cat "$dir.log" >&2; exit 1; }
    # Timed steps only, by wall clock (as the PyTorch side): from the end of the warm-up to the last step.
    ct=$($PY -c "
import json
rows=[json.loads(l) for l in open('$dir/metrics.jsonl')]
timed=rows[$WU:]
print(${B}*${NPROC}*${T}*len(timed)/(timed[-1]['time_s']-rows[$WU-1]['time_s']))")
    printf "round %d: pytorch_ddp %8.1f tokens/s   crosstrain %8.1f tokens/s\n" "$round" "$pt" "$ct"
    pt_all+=("$pt"); ct_all+=("$ct")
  done
  $PY - "$name" "$precision" "${pt_all[*]}" "${ct_all[*]}" >> "$tmp/ratios" <<'PYEOF'
import sys
name, precision = sys.argv[1], sys.argv[2]
pt = [float(x) for x in sys.argv[3].split()]
ct = [float(x) for x in sys.argv[4].split()]
mp, mc = sum(pt) / len(pt), sum(ct) / len(ct)
print(name, precision, mp, mc, mc / mp)
PYEOF
  tail -1 "$tmp/ratios" | awk '{printf "case %s %s: pytorch_ddp_tokens_per_s=%.1f crosstrain_tokens_per_s=%.1f ratio=%.3f\n", $1, $2, $3, $4, $5}'
}

for name in $SHAPES; do
  [[ -n "${CASES[$name]:-}" ]] || { echo "bench-ddp: unknown shape '$name' (use demo, gpt_small, or SHAPE=...)" >&2; exit 1; }
  for precision in $PRECISIONS; do run_case "$name" "$precision"; done
done

$PY - "$tmp/ratios" <<'PYEOF'
import sys
rows = [l.split() for l in open(sys.argv[1])]
worst = {}
for name, precision, _, _, ratio in rows:
    key = "ratio_vs_pytorch" + ("_bf16" if precision == "bf16" else "")
    print(f"{key}_{name}={float(ratio):.3f}")
    worst[key] = min(worst.get(key, float("inf")), float(ratio))
targets = {"ratio_vs_pytorch": 1.15, "ratio_vs_pytorch_bf16": 1.2}
for key, value in worst.items():
    verdict = "met" if value >= targets[key] else "MISSED"
    print(f"# {key}: smallest over the shapes, target {targets[key]}: {verdict}")
    print(f"{key}={value:.3f}")
PYEOF
