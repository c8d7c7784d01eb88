#!/usr/bin/env bash
# shellcheck disable=SC2016  # the single-quoted command is expanded by each host
# Elastic DiLoCo across 3 emulated clusters (one host each, 100mbit, 25 ms one-way; issue 33): the wide-area link
# of cluster 2 is cut for 12 s mid-run. The coordinator (on cluster 0) stops hearing cluster 2's heartbeat and the
# other two clusters go on without it in a failure generation; once the link is back, cluster 2's rank (ended and
# restarted by its launcher, or recovered by itself) rejoins in a join generation with the outer state of the
# others bit for bit, and the run ends on all three hosts with every step once in metrics.jsonl. The launchers run
# with --standby on node 1 (cluster 1): a cut that hides node 0 from cluster 2 must not move cluster 2 to a standby
# that never takes over (node 1 still reaches node 0), or its rank would never come back.
#   test_elastic_link_cut.sh --testbed scripts/testbed --relay build/crosstrain-delay-relay --crosstrain build/crosstrain --recipe recipes/gpt-tiny.toml
set -euo pipefail

if [[ $(id -u) != 0 ]]; then
  echo "SKIP: the net tests need root (network namespaces, veth, tbf); CI runs them as root"
  exit 77
fi

TB="" RELAY="" BIN="" RECIPE=""
while (($#)); do
  case $1 in
    --testbed) TB=$2 ;;
    --relay) RELAY=$2 ;;
    --crosstrain) BIN=$2 ;;
    --recipe) RECIPE=$2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
[[ -x $TB && -x $RELAY && -x $BIN && -f $RECIPE ]] || { echo "need --testbed, --relay, --crosstrain and --recipe" >&2; exit 2; }

NAME=ctcut$$
STEPS=${STEPS:-400}
tmp=$(mktemp -d)
trap '"$TB" down "$NAME" > /dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() { echo "FAIL: $*" >&2; tail -n 5 "$tmp"/logs/*.log >&2 || true; exit 1; }

sets="--set run.dir=$tmp/run --set train.steps=$STEPS --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2"
sets="$sets --set model.block_size=32 --set train.global_batch=12 --set train.warmup_steps=2 --set train.eval_every=0"
sets="$sets --set train.sample_tokens=0 --set comm.timeout_s=20 --set sync.mode=diloco --set sync.clusters=3"
sets="$sets --set sync.inner_steps=5 --set sync.slow_rank=0 --set sync.slow_ms=40 --set debug.elastic_digest=true"
"$TB" run --name "$NAME" --clusters 3 --hosts-per-cluster 1 --wan-rate 100mbit --wan-delay-ms 25 \
  --relay "$RELAY" --timeout 300 --log-dir "$tmp/logs" -- \
  env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 sh -c '
    exec "$0" run --nnodes "$CT_NNODES" --node-rank "$CT_NODE_RANK" --nproc 1 --master "$CT_MASTER_ADDR:29500" \
      --standby 10.77.1.1:29501 --timeout 60 --max-restarts 3 -- "$0" train "$1" '"$sets" "$BIN" "$RECIPE" > "$tmp/run.out" 2>&1 &
run=$!

rows() { [[ -f $tmp/run/metrics.jsonl ]] && wc -l < "$tmp/run/metrics.jsonl" || echo 0; }
for _ in $(seq 1 1200); do (($(rows) >= 10)) && break; kill -0 $run 2> /dev/null || break; sleep 0.1; done
(($(rows) >= 10)) || { wait $run || true; tail -20 "$tmp/run.out"; fail "the run never reached step 10"; }
T0=$SECONDS
"$TB" cut "$NAME" --cluster 2
echo "cut cluster 2's link at step $(rows)"
sleep 12
"$TB" heal "$NAME" --cluster 2
echo "healed it at step $(rows), after $((SECONDS - T0)) s"
wait $run || { tail -20 "$tmp/run.out"; fail "testbed run failed"; }
grep -q "all 3 hosts succeeded" "$tmp/run.out" || fail "not every host succeeded"

coord=$tmp/logs/c0-h0.log
failure=$(sed -n 's/.*\] generation \([0-9]*\) (failure): 2 replicas (0,1), 2 ranks.*/\1/p' "$coord" | head -1)
[[ -n $failure ]] || fail "no failure generation without cluster 2"
join=$(sed -n 's/.*\] generation \([0-9]*\) (join): 3 replicas (0,1,2), 3 ranks.*/\1/p' "$coord" | awk -v f="$failure" '$1 > f' | head -1)
[[ -n $join ]] || fail "cluster 2 was not readmitted after generation $failure"
echo "ok: generation $failure went on without cluster 2, generation $join took it back"
grep -hE "generation ($failure|$join) \((failure|join)\)|restarting it|ending rank|healed from|aborted|ended before|lost the job" "$tmp"/logs/*.log | cut -c1-200 || true
digests=$(cat "$tmp"/logs/c*-h0.log | sed -n "s/.*rank \([0-9]\) generation $join state digest [0-9a-f]* at step [0-9]*; outer state digest \([0-9a-f]*\).*/\1 \2/p" | sort -u)
[[ $(wc -l <<< "$digests") == 3 ]] || fail "expected the outer digests of 3 ranks at generation $join, got: $digests"
[[ $(awk '{print $2}' <<< "$digests" | sort -u | wc -l) == 1 ]] || fail "the outer states differ at generation $join: $digests"
echo "ok: the 3 clusters hold the same outer state at generation $join"
python3 - "$tmp/run/metrics.jsonl" "$STEPS" <<'PY' || fail "metrics.jsonl does not hold every step once"
import json, sys
steps = [json.loads(line)["step"] for line in open(sys.argv[1])]
sys.exit(0 if steps == list(range(1, int(sys.argv[2]) + 1)) else 1)
PY
grep -q "reporting to the standby" "$tmp"/logs/*.log && fail "a launcher moved to the standby, which never took over"
echo "ok: every step once, nobody moved to the standby; passed in $SECONDS s"
