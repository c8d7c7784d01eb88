#!/usr/bin/env bash
# make bench-wan: every sync.mode on the emulated testbed (2 clusters x 2 hosts, 100 Mbit/s, 25 ms one way), gpt-tiny,
# the same token budget (STEPS x 16 sequences x 128 tokens) and seed. Prints one line per mode:
#   mode=... wan_bytes=... wall_s=... val_loss=... utilization=...
# wan_bytes: measured by the testbed (IP bytes that crossed the wide-area links, both directions, with headers).
# wall_s: training time of rank 0 (metrics.jsonl time_s, final evaluation included; process start-up excluded).
# utilization: rank 0's compute time over wall time (compute = step time not spent waiting on communication).
# Needs root (network namespaces). Environment: STEPS (default 300), MODES (names below), BUILD (default build),
# EXTRA (more --set overrides for every mode, e.g. "comm.encrypt=wan"),
# CUT=1 also cuts the wide-area link for 10 s in the middle of each run and reports what happened.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/crosstrain
STEPS=${STEPS:-300}
CUT=${CUT:-0}
CUT_AT=${CUT_AT:-}            # seconds after the start of a run (default: half of the mode's expected wall time)
TIMEOUT=${TIMEOUT:-900}      # per run, seconds
OUT=${OUT:-runs/bench-wan}
[ "$(id -u)" = 0 ] || { echo "bench-wan: needs root (scripts/testbed creates network namespaces)"; exit 1; }
[ -x "$BIN" ] && [ -x "$BUILD/crosstrain-delay-relay" ] || { echo "bench-wan: build $BIN and crosstrain-delay-relay first"; exit 1; }

# name | --set overrides | expected seconds (for the cut)
# DiLoCo's outer step: Nesterov SGD with lr 1.0 and momentum 0.5 here. A 300-step budget has only 3-6 outer
# steps; the paper's momentum 0.9 (for hundreds of outer steps) overshoots there (diloco-h50-paper shows it).
OUTER="sync.outer_lr=1.0 sync.outer_momentum=0.5"
declare -A SETS=(
  [sync]="sync.mode=sync"
  [sync-hier]="sync.mode=sync sync.hierarchical=true"
  [diloco-h50]="sync.mode=diloco sync.inner_steps=50 $OUTER"
  [diloco-h50-paper]="sync.mode=diloco sync.inner_steps=50 sync.outer_lr=0.7 sync.outer_momentum=0.9"
  [diloco-h100]="sync.mode=diloco sync.inner_steps=100 $OUTER"
  [diloco-h100-int8]="sync.mode=diloco sync.inner_steps=100 sync.compression=int8 $OUTER"
  [diloco-h60-int8]="sync.mode=diloco sync.inner_steps=60 sync.compression=int8 $OUTER"
  [diloco-h150]="sync.mode=diloco sync.inner_steps=150 $OUTER"
  [diloco-stream]="sync.mode=diloco sync.inner_steps=100 sync.fragments=3 sync.overlap_steps=10 $OUTER"
  # Tensor parallel inside each cluster (the 2 hosts of a cluster hold one replica): each rank exchanges its shard.
  [diloco-tp2]="sync.mode=diloco sync.inner_steps=100 parallel.tp=2 $OUTER"
  [ssp]="sync.mode=ssp sync.period=10 sync.staleness=20 sync.slow_rank=3 sync.slow_ms=100"
  [sync-slow]="sync.mode=sync sync.slow_rank=3 sync.slow_ms=100"
  [async]="sync.mode=async sync.period=10"
  [gossip]="sync.mode=gossip sync.period=10"
)
MODES=${MODES:-"sync sync-hier diloco-h50 diloco-h100 diloco-h100-int8 diloco-h60-int8 diloco-stream diloco-tp2 ssp async gossip"}
mkdir -p "$OUT"
echo "# gpt-tiny, 2 clusters x 2 hosts (1 rank each), wan 100mbit / 25 ms one way, $STEPS steps x 16 x 128 tokens"
for mode in $MODES; do
  sets=${SETS[$mode]:?unknown mode $mode}
  dir=$OUT/$mode
  rm -rf "$dir" "$OUT/$mode.logs"
  args=""
  for s in $sets ${EXTRA:-}; do args="$args --set $s"; done
  args="$args --set run.dir=$dir --set train.steps=$STEPS --set train.eval_every=$STEPS --set train.eval_batches=8"
  args="$args --set train.sample_tokens=0 --set run.log_every=50 --set comm.timeout_s=${COMM_TIMEOUT:-60}"
  name=wan$$
  start=$(date +%s.%N)
  if [ "$CUT" = 1 ]; then
    # Cut the wide-area link for 10 s once the run is well into training, then heal it.
    ( at=${CUT_AT:-30}; sleep "$at"; scripts/testbed cut "$name" > /dev/null 2>&1 && echo "cut at ${at}s" > "$OUT/$mode.cut" \
      && sleep 10 && scripts/testbed heal "$name" > /dev/null 2>&1 && echo "healed at $((at + 10))s" >> "$OUT/$mode.cut" ) &
    cutter=$!
  fi
  set +e
  CROSSTRAIN_BUILD=$BUILD scripts/testbed run --name "$name" --clusters 2 --hosts-per-cluster 2 --wan-rate 100mbit \
    --wan-delay-ms 25 --timeout "$TIMEOUT" --log-dir "$OUT/$mode.logs" -- \
    sh -c "exec $BIN run --nnodes \$CT_NNODES --node-rank \$CT_NODE_RANK --nproc 1 --master \$CT_MASTER_ADDR:29500 -- \
           $BIN train recipes/gpt-tiny.toml $args" > "$OUT/$mode.log" 2>&1
  rc=$?
  set -e
  [ "$CUT" = 1 ] && wait "$cutter" 2> /dev/null || true
  end=$(date +%s.%N)
  wan=$(grep -o 'testbed run: wan bytes [0-9]*' "$OUT/$mode.log" | awk '{print $5}')
  /usr/bin/python3 - "$dir/metrics.jsonl" "$mode" "${wan:-0}" "$rc" "$start" "$end" <<'PY'
import json, os, sys
path, mode, wan, rc, start, end = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
last = rows[-1] if rows else {}
val = last.get("val_loss", float("nan"))
extra = ""
if "staleness_mean" in last:
    extra = " staleness_mean=%.2f staleness_max=%d" % (last["staleness_mean"], last["staleness_max"])
status = "" if rc == 0 else " FAILED(rc=%d, %d steps done)" % (rc, len(rows))
print("mode=%s wan_bytes=%d wall_s=%.1f val_loss=%.4f utilization=%.2f%s total_s=%.1f%s" % (
    mode, wan, last.get("time_s", float("nan")), val, last.get("utilization", float("nan")), extra, end - start, status))
PY
  if [ "$CUT" = 1 ]; then
    echo "  cut: $(tr '\n' ' ' < "$OUT/$mode.cut" 2> /dev/null); exit status $rc"
    grep -h -i -m3 'error\|failed\|timed out' "$OUT/$mode.log" | cut -c1-300 | sed 's/^/  /' || true
  fi
done
