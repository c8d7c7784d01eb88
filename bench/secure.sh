#!/usr/bin/env bash
# make bench-secure: what the sealed data plane (comm.encrypt) costs.
#   1. AEAD rate of one core (crosstrain bench seal): aead_GBps_per_core
#   2. all-reduce bus bandwidth of 2 ranks over loopback TCP (shared memory off, so every byte crosses a socket),
#      comm.encrypt = off and all in alternating rounds: loopback_busbw_ratio (median sealed / median plain)
#   3. DiLoCo across the emulated wide-area testbed (bench/wan.sh's diloco-h100: 2 clusters x 2 hosts, 100 Mbit/s,
#      25 ms), comm.encrypt = off and wan in alternating rounds: wan_slowdown_pct (median wall time); needs root.
# Environment: ROUNDS (default 3), SIZE (default 64M), STEPS (default 300), WAN=0 skips part 3, BUILD.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/crosstrain
ROUNDS=${ROUNDS:-3}
SIZE=${SIZE:-64M}
STEPS=${STEPS:-300}
WAN=${WAN:-1}
OUT=${OUT:-runs/bench-secure}
mkdir -p "$OUT"
# Both ends must hold the same secret; a fresh one for this benchmark.
CROSSTRAIN_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export CROSSTRAIN_SECRET

"$BIN" bench seal | tee "$OUT/seal.log"
aead=$(grep -o 'aead_GBps_per_core=[0-9.]*' "$OUT/seal.log" | cut -d= -f2)

echo "# all-reduce of $SIZE on 2 ranks over loopback TCP, $ROUNDS rounds of off/all"
for r in $(seq "$ROUNDS"); do
  for e in off all; do
    "$BIN" bench comm --op allreduce --nproc 2 --sizes "$SIZE:$SIZE" --iters 20 --encrypt "$e" \
      --json "$OUT/comm-$e-$r.json" > "$OUT/comm-$e-$r.log"
    grep -E '^ +[0-9]' "$OUT/comm-$e-$r.log" | sed "s/^/round $r $e: /"
  done
done
ratio=$(/usr/bin/python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
bw = {e: [json.load(open("%s/comm-%s-%d.json" % (out, e, r)))[-1]["busbw"] for r in range(1, rounds + 1)] for e in ("off", "all")}
wrong = sum(json.load(open("%s/comm-%s-%d.json" % (out, e, r)))[-1]["wrong"] for e in bw for r in range(1, rounds + 1))
if wrong: sys.exit("bench-secure: %d wrong results" % wrong)
print("%.2f" % (statistics.median(bw["all"]) / statistics.median(bw["off"])))
PY
)

slowdown=n/a
if [ "$WAN" = 1 ] && [ "$(id -u)" = 0 ]; then
  echo "# DiLoCo (H=100) across 2 clusters x 2 hosts, 100 Mbit/s, 25 ms; $STEPS steps; $ROUNDS rounds of off/wan"
  : > "$OUT/wan.txt"
  for r in $(seq "$ROUNDS"); do
    for e in off wan; do
      line=$(STEPS=$STEPS MODES=diloco-h100 OUT="$OUT/wan-$e-$r" EXTRA="comm.encrypt=$e" BUILD=$BUILD bench/wan.sh | grep '^mode=')
      echo "round $r $e: $line"
      echo "$e $line" >> "$OUT/wan.txt"
      # A sealed run must have sealed its groups: rank 0 says so when the world forms.
      if [ "$e" = wan ] && ! grep -q 'sealed' "$OUT/wan-$e-$r/diloco-h100.log"; then
        echo "bench-secure: the comm.encrypt = wan run did not seal its wide-area groups"; exit 1
      fi
    done
  done
  slowdown=$(/usr/bin/python3 - "$OUT/wan.txt" <<'PY'
import re, statistics, sys
t = {"off": [], "wan": []}
for line in open(sys.argv[1]):
    e = line.split()[0]
    if "FAILED" in line: sys.exit("bench-secure: a run failed: " + line.strip())
    t[e].append(float(re.search(r"wall_s=([0-9.]+)", line).group(1)))
print("%.1f" % (100 * (statistics.median(t["wan"]) / statistics.median(t["off"]) - 1)))
PY
)
fi
echo "wan_slowdown_pct=$slowdown loopback_busbw_ratio=$ratio aead_GBps_per_core=$aead"
