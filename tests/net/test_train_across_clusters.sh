#!/usr/bin/env bash
# shellcheck disable=SC2016  # the single-quoted command is expanded by each host
# Training across the emulated clusters (2 clusters x 2 hosts, 100mbit, 25 ms one-way), one rank per host, each
# host's cluster taken from the testbed's CT_CLUSTER: a short DiLoCo run (H=5) and the same run with plain sync.
# DiLoCo must find 2 clusters, do its outer steps, and send far fewer bytes over the wide-area link than sync,
# which must still reach the same final loss range.
#   test_train_across_clusters.sh --testbed scripts/testbed --relay build/crosstrain-delay-relay --crosstrain build/crosstrain --recipe recipes/gpt-tiny.toml
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

NAME=cttrain$$
tmp=$(mktemp -d)
trap 'for m in diloco sync; do "$TB" down "${NAME}$m" > /dev/null 2>&1 || true; done; rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

# A small model and a short run; the corpus is the recipe's (Debian's fortunes, installed by the setup).
train() {  # mode-name, then --set overrides
  local mode=$1; shift
  local sets="--set run.dir=$tmp/$mode --set train.steps=20 --set model.n_layer=2 --set model.n_embd=64"
  sets="$sets --set model.n_head=2 --set model.block_size=64 --set train.global_batch=8 --set train.warmup_steps=2"
  sets="$sets --set train.eval_every=20 --set train.eval_batches=2 --set train.sample_tokens=0 --set comm.timeout_s=60"
  for s in "$@"; do sets="$sets --set $s"; done
  "$TB" run --name "${NAME}$mode" --clusters 2 --hosts-per-cluster 2 --wan-rate 100mbit --wan-delay-ms 25 \
    --relay "$RELAY" --timeout 200 --log-dir "$tmp/$mode.logs" -- \
    env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 sh -c '
      exec "$0" run --nnodes "$CT_NNODES" --node-rank "$CT_NODE_RANK" --nproc 1 --master "$CT_MASTER_ADDR:29500" \
        --timeout 60 -- "$0" train "$1" '"$sets" "$BIN" "$RECIPE" > "$tmp/$mode.out" 2>&1 ||
    { tail -20 "$tmp/$mode.out"; fail "$mode: testbed run failed"; }
  grep -q "all 4 hosts succeeded" "$tmp/$mode.out" || fail "$mode: not every host succeeded"
  sed -n 's/^testbed run: wan bytes //p' "$tmp/$mode.out"
}
last() {  # run, key
  /usr/bin/python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])[sys.argv[2]])" \
    "$tmp/$1/metrics.jsonl" "$2"
}

T0=$SECONDS
wan_diloco=$(train diloco sync.mode=diloco sync.inner_steps=5 sync.outer_lr=1.0 sync.outer_momentum=0.5)
grep -q "diloco (H=5.*2 clusters" "$tmp/diloco.logs/c0-h0.log" || fail "diloco did not find the 2 clusters of the testbed"
[[ $(last diloco sync_exchanges) == 4 ]] || fail "diloco made $(last diloco sync_exchanges) outer steps in 20 steps, expected 4"
echo "ok: diloco found 2 clusters and made 4 outer steps; $wan_diloco bytes crossed the wide-area link"
wan_sync=$(train sync sync.mode=sync)
echo "ok: sync sent $wan_sync bytes across"
((wan_diloco * 3 < wan_sync)) || fail "diloco sent $wan_diloco bytes, not 3x fewer than sync's $wan_sync"
loss_d=$(last diloco val_loss) loss_s=$(last sync val_loss)
awk -v d="$loss_d" -v s="$loss_s" 'BEGIN { exit !(d < 5.3 && s < 5.3 && d < 1.1 * s) }' ||
  fail "validation loss diloco $loss_d, sync $loss_s: not trained, or diloco more than 10% behind"
echo "ok: validation loss diloco $loss_d, sync $loss_s"
left=$(ip netns list | awk '{print $1}' | grep "^$NAME" || true)
[[ -z $left ]] || fail "namespaces left behind: $left"
echo "--- passed in $((SECONDS - T0)) s"
