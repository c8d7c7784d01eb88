#!/usr/bin/env bash
# shellcheck disable=SC2016  # the single-quoted command is expanded by each host
# comm.encrypt with an attacker on the wide-area link (issue 34): 2 clusters x 1 host, the delay relay as a tap
# and as an attacker that flips bytes (fixing TCP checksums, so the bytes reach the application).
#   1. plain:  a broadcast's known values (0, 1, 2, 0, 1, 2 ... as float) are read off the wide-area link;
#   2. sealed: the same run with comm.encrypt = wan (the job's secret): the groups across clusters are sealed,
#      the results are right, and the link carries none of those bytes;
#   3. sealed under attack: every 40th data segment changed on the way: the run stops with an error naming the
#      peer and "did not authenticate", never with a wrong result.
#   test_secure_wan.sh --testbed scripts/testbed --relay build/crosstrain-delay-relay --crosstrain build/crosstrain
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

NAME=ctsecure$$
tmp=$(mktemp -d)
trap '"$TB" down "$NAME" > /dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

CROSSTRAIN_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export CROSSTRAIN_SECRET

# One run of `bench comm` across the two clusters; extra testbed options in "$@" before --.
across() {
  local encrypt=$1 op=$2 tag=$3
  shift 3
  "$TB" run --name "$NAME" --clusters 2 --hosts-per-cluster 1 --wan-rate 1gbit --wan-delay-ms 2 --relay "$RELAY" \
    --timeout 100 --log-dir "$tmp/$tag.logs" "$@" -- \
    env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 CT_ENCRYPT="$encrypt" CT_OP="$op" sh -c '
      exec "$0" run --nnodes "$CT_NNODES" --node-rank "$CT_NODE_RANK" --nproc 1 --master "$CT_MASTER_ADDR:29500" \
        --timeout 60 -- "$0" bench comm --op "$CT_OP" --sizes 64K:1M --step-factor 16 --iters 3 --warmup 1 \
        --timeout 20 --encrypt "$CT_ENCRYPT"' "$BIN" > "$tmp/$tag.out" 2>&1
}

# Whether FILE holds 24 bytes of the floats 0, 1, 2, 0, 1, 2 (bench comm's broadcast values).
holds_pattern() {
  /usr/bin/python3 - "$1" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
probe = struct.pack("<6f", 0, 1, 2, 0, 1, 2)
print("capture: %d bytes" % len(data))
sys.exit(0 if probe in data else 1)
PY
}

echo "--- 1. plain: a tap reads the values"
across off broadcast plain --wan-capture "$tmp/plain.cap" || { cat "$tmp/plain.out"; fail "the plain run failed"; }
holds_pattern "$tmp/plain.cap" || fail "the tap did not see the broadcast's values in a plain run (the test cannot see)"
echo "ok: plain broadcast values are on the wide-area link"

echo "--- 2. sealed: nothing readable, results right"
across wan broadcast sealed --wan-capture "$tmp/sealed.cap" || { cat "$tmp/sealed.out"; fail "the sealed run failed"; }
grep -q "group world sealed (comm.encrypt = wan): 2 ranks in 2 cluster(s)" "$tmp/sealed.out" ||
  { cat "$tmp/sealed.out"; fail "the world across two clusters was not sealed"; }
wrong=$(sed -n 's/^\[rank 0\] //p' "$tmp/sealed.logs/c0-h0.log" | grep -v '^#' | awk 'NF == 9 { s += $9 } END { print s + 0 }')
[[ $wrong == 0 ]] || fail "the sealed broadcast gave $wrong wrong results"
size=$(stat -c %s "$tmp/sealed.cap")
((size > 1000000)) || fail "the tap captured only $size bytes of the sealed run"
if holds_pattern "$tmp/sealed.cap"; then fail "the sealed run's values are readable on the wide-area link"; fi
echo "ok: the sealed run's $size bytes on the link hold none of its values"

echo "--- 3. sealed, bytes changed on the way: detected, never used"
rc=0
across wan allreduce attacked --wan-flip-every 40 || rc=$?
((rc != 0)) || { cat "$tmp/attacked.out"; fail "a run whose messages were changed on the way succeeded"; }
grep -q "did not authenticate" "$tmp/attacked.out" || { tail -30 "$tmp/attacked.out"; fail "no rank said a message did not authenticate"; }
grep -q "from rank [01]" "$tmp/attacked.out" || fail "the error does not name the peer"
if grep -v '^#' "$tmp/attacked.logs/c0-h0.log" | awk 'NF == 10 && $9 > 0' | grep -q .; then
  fail "a changed message was reduced into a result"
fi
grep -m1 "did not authenticate" "$tmp/attacked.out" | cut -c1-300
echo "ok: changed messages are refused naming the peer"
