#!/usr/bin/env bash
# shellcheck disable=SC2016  # the single-quoted command is expanded by each host
# Elastic DiLoCo across 3 emulated clusters with a sealed wide-area group (comm.encrypt = auto: wan, the job has a
# secret; issue 34): once the run is going, the relay on the wide-area path changes one bulk segment (a byte of a
# sealed tensor, checksum fixed). The rank that reads it reports its sender; the coordinator excludes the sender
# (its launcher ends it and starts it again), the others go on in a failure generation, the sender rejoins with
# fresh keys, and the run ends on all three hosts with every step once and one outer state.
#   test_elastic_tamper.sh --testbed scripts/testbed --relay build/crosstrain-delay-relay --crosstrain build/crosstrain --recipe recipes/gpt-tiny.toml
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

NAME=cttamper$$
STEPS=${STEPS:-200}
tmp=$(mktemp -d)
trap '"$TB" down "$NAME" > /dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() { echo "FAIL: $*" >&2; tail -n 5 "$tmp"/logs/*.log >&2 || true; exit 1; }

CROSSTRAIN_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export CROSSTRAIN_SECRET

sets="--set run.dir=$tmp/run --set train.steps=$STEPS --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2"
sets="$sets --set model.block_size=32 --set train.global_batch=12 --set train.warmup_steps=2 --set train.eval_every=0"
sets="$sets --set train.sample_tokens=0 --set comm.timeout_s=20 --set sync.mode=diloco --set sync.clusters=3"
sets="$sets --set sync.inner_steps=5 --set sync.slow_rank=0 --set sync.slow_ms=40 --set debug.elastic_digest=true"
"$TB" run --name "$NAME" --clusters 3 --hosts-per-cluster 1 --wan-rate 100mbit --wan-delay-ms 10 \
  --relay "$RELAY" --timeout 300 --log-dir "$tmp/logs" -- \
  env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 sh -c '
    exec "$0" run --nnodes "$CT_NNODES" --node-rank "$CT_NODE_RANK" --nproc 1 --master "$CT_MASTER_ADDR:29500" \
      --timeout 60 --max-restarts 3 -- "$0" train "$1" '"$sets" "$BIN" "$RECIPE" > "$tmp/run.out" 2>&1 &
run=$!

rows() { [[ -f $tmp/run/metrics.jsonl ]] && wc -l < "$tmp/run/metrics.jsonl" || echo 0; }
for _ in $(seq 1 1200); do (($(rows) >= 12)) && break; kill -0 $run 2> /dev/null || break; sleep 0.1; done
(($(rows) >= 12)) || { wait $run || true; tail -20 "$tmp/run.out"; fail "the run never reached step 12"; }
"$TB" tamper "$NAME"
relay_log=${CROSSTRAIN_TESTBED_STATE:-/run/crosstrain-testbed}/$NAME/relay.log
for _ in $(seq 1 300); do grep -q "flipped a byte" "$relay_log" 2> /dev/null && break; sleep 0.1; done
grep -h "flipped a byte" "$relay_log" || fail "the relay changed nothing within 30 s"
echo "tampered with the wide-area link at step $(rows)"
wait $run || { tail -20 "$tmp/run.out"; fail "testbed run failed"; }
grep -q "all 3 hosts succeeded" "$tmp/run.out" || fail "not every host succeeded"

coord=$tmp/logs/c0-h0.log
report=$(grep -m1 "reports that rank [0-2]'s messages did not authenticate" "$coord") ||
  { grep -hE "did not authenticate|generation [0-9]+ \(" "$tmp"/logs/*.log | cut -c1-240; fail "no rank reported a message that did not authenticate"; }
echo "$report" | cut -c1-300
accused=$(sed -n "s/.*reports that rank \([0-2]\)'s messages.*/\1/p" <<< "$report")
failure=$(sed -n "s/.*\] generation \([0-9]*\) (failure): 2 replicas .*rank $accused excluded: its messages to rank [0-2] did not authenticate.*/\1/p" "$coord" | head -1)
[[ -n $failure ]] || { grep "generation" "$coord" | cut -c1-240; fail "no failure generation excluded rank $accused for its messages"; }
join=$(sed -n 's/.*\] generation \([0-9]*\) (join): 3 replicas (0,1,2), 3 ranks.*/\1/p' "$coord" | awk -v f="$failure" '$1 > f' | head -1)
[[ -n $join ]] || fail "rank $accused was not readmitted after generation $failure"
echo "ok: generation $failure went on without rank $accused, generation $join took it back"
grep -hE "generation ($failure|$join) \((failure|join)\)|restarting it|ending rank|asked the coordinator|aborted" "$tmp"/logs/*.log | cut -c1-200 || true
digests=$(cat "$tmp"/logs/c*-h0.log | sed -n "s/.*rank \([0-9]\) generation $join state digest [0-9a-f]* at step [0-9]*; outer state digest \([0-9a-f]*\).*/\1 \2/p" | sort -u)
[[ $(wc -l <<< "$digests") == 3 ]] || fail "expected the outer digests of 3 ranks at generation $join, got: $digests"
[[ $(awk '{print $2}' <<< "$digests" | sort -u | wc -l) == 1 ]] || fail "the outer states differ at generation $join: $digests"
echo "ok: the 3 clusters hold the same outer state at generation $join"
python3 - "$tmp/run/metrics.jsonl" "$STEPS" <<'PY' || fail "metrics.jsonl does not hold every step once"
import json, sys
steps = [json.loads(line)["step"] for line in open(sys.argv[1])]
want = list(range(1, int(sys.argv[2]) + 1))
if steps != want:
    repeated = sorted({s for s in steps if steps.count(s) > 1})
    print("metrics.jsonl: %d rows, missing %s, repeated %s" % (len(steps), sorted(set(want) - set(steps))[:20], repeated[:20]))
sys.exit(0 if steps == want else 1)
PY
echo "ok: every step once; passed in $SECONDS s"
