#!/usr/bin/env bash
# shellcheck disable=SC2016  # single-quoted commands are expanded by the hosts
# The emulated multi-cluster testbed: 2 clusters x 2 hosts joined by a 100mbit, 25 ms one-way link.
# Checks delay, bandwidth, byte counting, cut/heal, clean removal (also after its user was killed), and errors.
#   test_testbed.sh --testbed scripts/testbed --relay build/crosstrain-delay-relay --probe build/tests/net/tcp_probe
set -euo pipefail

if [[ $(id -u) != 0 ]]; then
  echo "SKIP: the net tests need root (network namespaces, veth, tbf); CI runs them as root"
  exit 77
fi

TB="" RELAY="" PROBE=""
while (($#)); do
  case $1 in
    --testbed) TB=$2 ;;
    --relay) RELAY=$2 ;;
    --probe) PROBE=$2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
[[ -x $TB && -x $RELAY && -x $PROBE ]] || { echo "need --testbed, --relay and --probe" >&2; exit 2; }

NAME=ctnet$$ KNAME=ctnetk$$ TNAME=ctnett$$
T0=$SECONDS
cleanup() {
  local n
  for n in $NAME $KNAME $TNAME; do "$TB" down "$n" > /dev/null 2>&1 || echo "cleanup: down $n failed" >&2; done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "--- [$((SECONDS - T0)) s] $*"; }
value() { sed -n "s/^$1=//p" <<< "$2"; }
in_range() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v >= lo && v <= hi) }'; }
expect_range() { # LABEL VALUE LO HI
  if in_range "$2" "$3" "$4"; then echo "ok: $1 = $2 (expected $3..$4)"; else fail "$1 = $2, expected $3..$4"; fi
}
# No namespace, hosts file or state of testbed $1 is left.
expect_gone() {
  local left
  left=$(ip netns list | awk '{print $1}' | grep -E "^$1-" || true)
  [[ -z $left ]] || fail "namespaces left behind by $1: $left"
  ! compgen -G "/etc/netns/$1-*" > /dev/null || fail "/etc/netns entries left behind by $1"
  [[ ! -e /run/crosstrain-testbed/$1 ]] || fail "state of $1 left behind"
  echo "ok: nothing of $1 is left"
}
tb() { "$TB" "$@"; }
on() { # HOST CMD... : run in a host of $NAME
  local host=$1
  shift
  tb exec "$NAME" "$host" -- "$@"
}

step "bad usage gives clear errors"
expect_error() { # PATTERN CMD...
  local pattern=$1 out rc=0
  shift
  out=$("$@" 2>&1) || rc=$?
  ((rc != 0)) || fail "'$*' succeeded"
  grep -q -- "$pattern" <<< "$out" || fail "'$*' said '$out', expected '$pattern'"
  echo "ok: '$*' -> $(head -1 <<< "$out")"
}
expect_error "bad testbed name" tb up --name "bad-name"
expect_error "clusters wants" tb up --name x --clusters 0
expect_error "wan-rate wants" tb up --name x --wan-rate fast
expect_error "wan-delay-ms wants" tb up --name x --wan-delay-ms -3
expect_error "unknown option" tb up --name x --bogus 1
expect_error "unknown command" tb bogus
expect_error "no testbed named" tb status nosuchtestbed
expect_error "needs a command" tb run --relay "$RELAY"
as_nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
if command -v setpriv > /dev/null && "${as_nobody[@]}" test -r "$TB" 2> /dev/null; then
  expect_error "must run as root" "${as_nobody[@]}" "$TB" up --name x
fi

step "up $NAME: 2 clusters x 2 hosts, 100mbit, 25 ms"
tb up --name "$NAME" --clusters 2 --hosts-per-cluster 2 --wan-rate 100mbit --wan-delay-ms 25 --relay "$RELAY"
expect_error "already exists" tb up --name "$NAME" --relay "$RELAY"
expected_hosts="$NAME-c0-h0 10.77.0.1 0 0 0
$NAME-c0-h1 10.77.0.2 0 1 1
$NAME-c1-h0 10.77.1.1 1 0 2
$NAME-c1-h1 10.77.1.2 1 1 3"
[[ $(tb hosts "$NAME") == "$expected_hosts" ]] || fail "hosts: $(tb hosts "$NAME")"
env_line=$(on c1-h1 sh -c 'echo $CT_CLUSTER $CT_HOST $CT_HOST_ADDR $CT_NODE_RANK $CT_NNODES $CT_MASTER_ADDR $(hostname)')
[[ $env_line == "1 1 10.77.1.2 3 4 10.77.0.1 $NAME-c1-h1" ]] || fail "environment of c1-h1: $env_line"
echo "ok: hosts, addresses and environment"

# Echo/sink servers in the far cluster and in the near one.
on c1-h0 "$PROBE" serve --port 5001 --max-seconds 150 > /dev/null &
on c0-h1 "$PROBE" serve --port 5001 --max-seconds 150 > /dev/null &
server_pids=$(jobs -p)

step "round-trip times"
out=$(on c0-h0 "$PROBE" rtt --host 10.77.1.1 --port 5001 --count 20)
expect_range "rtt between clusters, median ms" "$(value rtt_ms_median "$out")" 45 80
expect_range "rtt between clusters, min ms" "$(value rtt_ms_min "$out")" 45 80
out=$(on c0-h0 "$PROBE" rtt --host 10.77.0.2 --port 5001 --count 20)
expect_range "rtt inside a cluster, median ms" "$(value rtt_ms_median "$out")" 0 5

step "bulk throughput and bytes over the wide-area link"
wan0=$(tb wan-bytes "$NAME")
bulk_bytes=25000000
out=$(on c0-h0 "$PROBE" bulk --host 10.77.1.1 --port 5001 --bytes $bulk_bytes)
cross=$(value mbit_s "$out")
expect_range "throughput between clusters, Mbit/s" "$cross" 60 110
wan1=$(tb wan-bytes "$NAME")
expect_range "wan bytes during the bulk transfer" $((wan1 - wan0)) $bulk_bytes $((bulk_bytes * 12 / 10))
out=$(on c0-h0 "$PROBE" bulk --host 10.77.0.2 --port 5001 --bytes 100000000)
intra=$(value mbit_s "$out")
expect_range "throughput inside a cluster, Mbit/s" "$intra" "$(awk -v c="$cross" 'BEGIN { print 4 * c }')" 1e9
wan2=$(tb wan-bytes "$NAME")
expect_range "wan bytes during the transfer inside a cluster" $((wan2 - wan1)) 0 10000
tb wan-bytes "$NAME" --per-link

step "cut: a connection across clusters fails within a few seconds; inside a cluster it still works"
tb cut "$NAME"
t=$(date +%s.%N)
if on c0-h0 "$PROBE" connect --host 10.77.1.1 --port 5001 --timeout-ms 3000; then fail "connected across a cut link"; fi
expect_range "seconds until the connection attempt gave up" "$(awk -v t="$t" -v n="$(date +%s.%N)" 'BEGIN { print n - t }')" 2.5 6
on c0-h0 "$PROBE" connect --host 10.77.0.2 --port 5001 --timeout-ms 3000 > /dev/null || fail "cut broke the cluster's own link"
grep -q "link of cluster 1: CUT" <<< "$(tb status "$NAME")" || fail "status does not show the cut"
step "heal: connections across clusters work again"
tb heal "$NAME"
out=$(on c0-h0 "$PROBE" connect --host 10.77.1.1 --port 5001 --timeout-ms 3000) || fail "no connection after heal"
expect_range "connection + echo after heal, ms" "$(value connected_ms "$out")" 45 200
tb cut "$NAME" --cluster 1
if on c0-h1 "$PROBE" connect --host 10.77.1.1 --port 5001 --timeout-ms 1500 2> /dev/null; then
  fail "connected to a cluster whose link is cut"
fi
tb heal "$NAME" --cluster 1
tb status "$NAME"

step "down with servers still running"
tb down "$NAME"
for p in $server_pids; do wait "$p" 2> /dev/null || true; done
expect_gone "$NAME"
tb down "$NAME" > /dev/null || fail "a second down failed"
echo "ok: down is idempotent"

step "run killed with SIGKILL (no cleanup possible), relay killed too: down still removes everything"
"$TB" run --name "$KNAME" --clusters 2 --hosts-per-cluster 1 --relay "$RELAY" -- sleep 100 > /dev/null 2>&1 &
run_pid=$!
for ((i = 0; i < 100; i++)); do
  [[ -n $(ip netns pids "$KNAME-c1-h0" 2> /dev/null) ]] && break
  sleep 0.1
done
sleeper=$(ip netns pids "$KNAME-c1-h0" 2> /dev/null || true)
[[ -n $sleeper ]] || fail "run did not start its command"
kill -KILL "$run_pid"
wait "$run_pid" 2> /dev/null || true # (bash reports the kill)
kill -KILL "$(cat "/run/crosstrain-testbed/$KNAME/relay.pid")"
ip netns list | grep -q "^$KNAME-" || fail "expected leftovers after SIGKILL"
tb down "$KNAME"
expect_gone "$KNAME"
for p in $sleeper; do
  state=$(sed 's/.*) //' "/proc/$p/stat" 2> /dev/null | cut -c1) || true
  [[ -z $state || $state == Z ]] || fail "process $p of the killed run survived down (state $state)"
done

step "run stopped with SIGTERM cleans up after itself"
run_log=$(mktemp)
"$TB" run --name "$TNAME" --clusters 2 --hosts-per-cluster 1 --relay "$RELAY" -- sleep 100 > "$run_log" 2>&1 &
run_pid=$!
for ((i = 0; i < 100; i++)); do
  [[ -n $(ip netns pids "$TNAME-c1-h0" 2> /dev/null) ]] && break
  sleep 0.1
done
kill -TERM "$run_pid"
rc=0
wait "$run_pid" || rc=$?
((rc != 0)) || fail "run exited 0 after SIGTERM"
grep -q "removed testbed $TNAME" "$run_log" || fail "run did not clean up after SIGTERM: $(cat "$run_log")"
rm -f "$run_log"
expect_gone "$TNAME"

step "run reports each host's exit status and fails when one fails"
out=$(tb run --name "$TNAME" --clusters 2 --hosts-per-cluster 2 --wan-delay-ms 0 --timeout 20 \
  -- sh -c 'exit $((CT_NODE_RANK == 2 ? 3 : 0))' 2>&1) && fail "run succeeded although a host failed"
grep -q "c1-h0 (node 2) exit status 3" <<< "$out" || fail "run output: $out"
grep -q "1 of 4 hosts failed" <<< "$out" || fail "run output: $out"
expect_gone "$TNAME"

step "passed in $((SECONDS - T0)) s"
