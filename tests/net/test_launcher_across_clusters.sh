#!/usr/bin/env bash
# shellcheck disable=SC2016  # the single-quoted command is expanded by each host
# The real launcher across the emulated clusters: 4 hosts (2 clusters x 2, 100mbit, 25 ms one-way), one rank
# each, rendezvous on host 0's address, then `crosstrain bench comm` all-reduces (checked for correctness by the
# benchmark itself). The timings must show the delay and the rate limit of the wide-area link, and its byte
# counter must show the traffic.
#   test_launcher_across_clusters.sh --testbed scripts/testbed --relay build/crosstrain-delay-relay --crosstrain build/crosstrain
set -euo pipefail

if [[ $(id -u) != 0 ]]; then
  echo "SKIP: the net tests need root (network namespaces, veth, tbf); CI runs them as root"
  exit 77
fi

TB="" RELAY="" BIN=""
while (($#)); do
  case $1 in
    --testbed) TB=$2 ;;
    --relay) RELAY=$2 ;;
    --crosstrain) BIN=$2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
[[ -x $TB && -x $RELAY && -x $BIN ]] || { echo "need --testbed, --relay and --crosstrain" >&2; exit 2; }

NAME=ctlaunch$$
tmp=$(mktemp -d)
trap '"$TB" down "$NAME" > /dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

T0=$SECONDS
rc=0
"$TB" run --name "$NAME" --clusters 2 --hosts-per-cluster 2 --wan-rate 100mbit --wan-delay-ms 25 --relay "$RELAY" \
  --timeout 150 --log-dir "$tmp/logs" -- \
  env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 sh -c '
    exec "$0" run --nnodes "$CT_NNODES" --node-rank "$CT_NODE_RANK" --nproc 1 --master "$CT_MASTER_ADDR:29500" \
      --timeout 60 -- "$0" bench comm --op allreduce --sizes 4:4M --step-factor 32 --iters 5 --warmup 1 --timeout 60' \
  "$BIN" | tee "$tmp/run.out" || rc=$?
echo "--- run took $((SECONDS - T0)) s"
((rc == 0)) || fail "testbed run failed (exit $rc)"
grep -q "all 4 hosts succeeded" "$tmp/run.out" || fail "not every host succeeded"

# Rank 0's rows: size count type redop root time(us) algbw busbw #wrong.
rows=$(sed -n 's/^\[rank 0\] //p' "$tmp/logs/c0-h0.log" | grep -v '^#' | awk 'NF == 9')
echo "rank 0 rows:"
echo "$rows"
small=$(awk '$1 == 4 { print $6 }' <<< "$rows")
large=$(awk '$1 == 4194304 { print $7 }' <<< "$rows")
[[ -n $small && -n $large ]] || fail "rank 0 printed no rows for 4 B and 4 MiB"
awk -v t="$small" 'BEGIN { exit !(t >= 25000 && t < 2000000) }' ||
  fail "a 4-byte all-reduce took $small us: the 25 ms wide-area delay is not on the path"
echo "ok: 4-byte all-reduce across clusters takes $small us (>= one 25 ms crossing)"
# Each cluster must receive at least 4 MiB of the other's sums: at 100 Mbit/s that bounds algbw by 0.0125 GB/s.
awk -v b="$large" 'BEGIN { exit !(b > 0.001 && b <= 0.014) }' ||
  fail "4 MiB all-reduce algbw $large GB/s: the 100 Mbit/s wide-area rate is not on the path"
echo "ok: 4 MiB all-reduce algbw $large GB/s (<= 0.0125 GB/s allowed by 100 Mbit/s)"
wan=$(sed -n 's/^testbed run: wan bytes //p' "$tmp/run.out")
((wan >= 8 * 1024 * 1024)) || fail "only $wan bytes crossed the wide-area links"
echo "ok: $wan bytes crossed the wide-area links"
for h in c0-h0 c0-h1 c1-h0 c1-h1; do
  [[ -e $tmp/logs/$h.log ]] || fail "no log of host $h"
done
left=$(ip netns list | awk '{print $1}' | grep "^$NAME-" || true)
[[ -z $left ]] || fail "namespaces left behind: $left"
echo "--- passed in $((SECONDS - T0)) s"
