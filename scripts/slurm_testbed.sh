#!/usr/bin/env bash
# A small real Slurm cluster on this machine, for tests and demos of the scheduler (docs/scheduler.md): its own
# munge daemon and key, slurmctld and one slurmd, all state under DIR, on ports PORT and PORT+1. Several can run
# side by side (other DIR and PORT). Needs root and Debian's slurm-wlm and munge (scripts/install-deps.sh).
#
#   scripts/slurm_testbed.sh start DIR NAME PORT [CPUS] [--testbed TB cC-hH[,cC-hH...]] [--private P KEEP[,KEEP]]
#                                          # prints the SLURM_CONF to use; waits until the nodes are idle. With
#                                          # --testbed the daemons (and so the jobs' processes) run in that host of
#                                          # the emulated testbed (scripts/testbed), on its address and hostname;
#                                          # several hosts: a node (slurmd, CPUS each) in each, the controller in
#                                          # the first; `testbed up --uplink` lets this machine's sbatch reach it
#                                          # --private (with --testbed): the nodes' processes see folder P empty but
#                                          # for its folders KEEP (the site's own storage): no other disk is shared
#   scripts/slurm_testbed.sh stop DIR                     # stops the daemons of DIR (idempotent)
#   scripts/slurm_testbed.sh kill DIR                     # a power cut: SIGKILL to its jobs' processes and daemons
#   SLURM_CONF=DIR/slurm.conf sbatch --wrap 'hostname'    # then: sbatch, srun, squeue, scancel, sinfo as usual
set -euo pipefail

usage() { sed -n '2,16p' "$0" >&2; exit 2; }
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Where the daemons run: this machine (nothing) or `testbed exec TB HOST --`; the name and address they use.
IN_HOST=() HOST_NAME="" HOST_ADDR=127.0.0.1
# Several nodes (--testbed with a list of hosts): each one's name, address and testbed host.
NODE_NAMES=() NODE_ADDRS=() NODE_HOSTS=() TESTBED=""
# --private: the folder the nodes see empty, and its folders they keep (comma-separated).
PRIVATE="" KEEP=""

stop_pidfile() {
  local f=$1
  [[ -f $f ]] || return 0
  local pid
  pid=$(cat "$f" 2>/dev/null || true)
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

descendants() {
  local child
  for child in $(pgrep -P "$1" || true); do
    echo "$child"
    descendants "$child"
  done
}

# Job steps outlive slurmd; they carry the cluster's SLURM_CONF (slurmd passes its environment on). Their whole
# process trees go (a batch script's launcher and its ranks are grandchildren of the step).
stop_job_steps() {
  local dir=$1 pid
  for pid in $(pgrep -x slurmstepd || true); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_CONF=$dir/slurm.conf"; then
      kill -STOP "$pid" 2>/dev/null || true
      # shellcheck disable=SC2046
      kill -KILL $(descendants "$pid") 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

stop() {
  local dir=$1
  if [[ -f $dir/slurm.conf ]]; then
    SLURM_CONF=$dir/slurm.conf timeout 5 scancel --user="$(id -un)" >/dev/null 2>&1 || true
  fi
  for f in "$dir"/slurmd*.pid; do stop_pidfile "$f"; done
  stop_job_steps "$dir"
  stop_pidfile "$dir/slurmctld.pid"
  stop_pidfile "$dir/munge/munged.pid"
}

# No goodbyes: the controller first (it stops answering), then the node daemon, the job steps and their processes.
power_cut() {
  local dir=$1 f
  for f in "$dir/slurmctld.pid" "$dir"/slurmd*.pid; do
    [[ -f $f ]] && kill -KILL "$(cat "$f")" 2>/dev/null || true
  done
  stop_job_steps "$dir"
  stop "$dir"
}

# --testbed TB cC-hH[,cC-hH...]: the daemons go into those hosts of the testbed (namespaces and hostnames): the
# controller and the first node daemon into the first, one node daemon into each other.
use_testbed() {
  local tb=$1 hosts=$2 host line
  TESTBED=$tb
  IFS=, read -r -a list <<< "$hosts"
  for host in "${list[@]}"; do
    [[ $tb =~ ^[A-Za-z0-9_]{1,24}$ && $host =~ ^c[0-9]+-h[0-9]+$ ]] ||
      { echo "slurm_testbed: --testbed wants a testbed name and hosts like c1-h0,c1-h1, got '$tb' '$hosts'" >&2; exit 2; }
    line=$("$REPO/scripts/testbed" hosts "$tb" | awk -v h="$tb-$host" '$1 == h') ||
      { echo "slurm_testbed: no testbed named '$tb' (scripts/testbed list)" >&2; exit 1; }
    [[ -n $line ]] || { echo "slurm_testbed: testbed $tb has no host $host" >&2; exit 1; }
    NODE_NAMES+=("${line%% *}")
    NODE_ADDRS+=("$(echo "$line" | cut -d' ' -f2)")
    NODE_HOSTS+=("$host")
  done
  HOST_NAME=${NODE_NAMES[0]}
  HOST_ADDR=${NODE_ADDRS[0]}
  IN_HOST=("$REPO/scripts/testbed" exec "$tb" "${NODE_HOSTS[0]}" --)
}

# The node lines of slurm.conf: one node on this machine (or the testbed host), or one in each testbed host.
node_lines() {
  local name=$1 cpus=$2 host=$3 i nodes=()
  if ((${#NODE_NAMES[@]} <= 1)); then
    echo "NodeName=$name-node NodeHostname=$host NodeAddr=$HOST_ADDR CPUs=$cpus RealMemory=2000 State=UNKNOWN"
    echo "PartitionName=main Nodes=$name-node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
    return
  fi
  for i in "${!NODE_NAMES[@]}"; do
    echo "NodeName=$name-node$i NodeHostname=${NODE_NAMES[$i]} NodeAddr=${NODE_ADDRS[$i]} CPUs=$cpus RealMemory=2000 State=UNKNOWN"
    nodes+=("$name-node$i")
  done
  echo "PartitionName=main Nodes=$(IFS=,; echo "${nodes[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
}

write_conf() {
  local dir=$1 name=$2 port=$3 cpus=$4 host spool="" pidname=""
  host=${HOST_NAME:-$(hostname)}
  # Several node daemons share the folder: each its own spool, pid and log file (%n: the node's name).
  if ((${#NODE_NAMES[@]} > 1)); then spool=%n pidname=.%n; fi
  cat > "$dir/slurm.conf" <<CONF
ClusterName=$name
SlurmctldHost=$host($HOST_ADDR)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/$spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd$pidname.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd$pidname.log
SlurmUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=10
SlurmdTimeout=10
$(node_lines "$name" "$cpus" "$host")
CONF
}

# `ip netns exec` gives a host a fresh /sys without the cgroup mounts slurmd needs: the machine's again. The
# command before the last word runs the rest in the host: in_host_with_cgroups testbed exec TB HOST -- slurmd ...
# With --private, also hides that folder (a tmpfs over it, in the host's own mount namespace) after setting its
# KEEP folders aside, and mounts them back: slurmd and its jobs see no other file of it.
in_host_with_cgroups() {
  local args=("$@") n=$#
  local i split=0
  for i in "${!args[@]}"; do [[ ${args[$i]} == -- ]] && split=$i; done
  "${args[@]:0:split+1}" sh -c 'grep " /sys/fs/cgroup" /proc/1/mounts | while read -r src mnt type opts _; do
      mkdir -p "$mnt" 2> /dev/null; mount -t "$type" -o "$opts" "$src" "$mnt"; done
    private=$1 keep=$2; shift 2
    if [ -n "$private" ]; then
      aside=$(mktemp -d /tmp/ct-keep.XXXXXX) || exit 1
      set -f; IFS=,; i=0
      for k in $keep; do mkdir -p "$k" "$aside/$i" && mount --bind "$k" "$aside/$i" || exit 1; i=$((i + 1)); done
      mount -t tmpfs -o mode=0755 ct-private "$private" || exit 1
      i=0
      for k in $keep; do mkdir -p "$k" && mount --move "$aside/$i" "$k" || exit 1; i=$((i + 1)); done
      unset IFS; set +f
      rm -rf "$aside"
    fi
    exec "$@"' sh "$PRIVATE" "$KEEP" "${args[@]:split+1:n}"
}

start() {
  local dir=$1 name=$2 port=$3 cpus=${4:-2}
  [[ $(id -u) -eq 0 ]] || { echo "slurm_testbed: needs root (slurmd runs jobs as any user)" >&2; exit 1; }
  for b in munged slurmctld slurmd sinfo; do
    command -v "$b" >/dev/null || { echo "slurm_testbed: $b is missing: scripts/install-deps.sh slurm-wlm munge" >&2; exit 1; }
  done
  stop "$dir"
  mkdir -p "$dir"/{state,spool,log,munge}
  chmod 700 "$dir/munge"
  head -c 1024 /dev/urandom > "$dir/munge/munge.key"
  chmod 600 "$dir/munge/munge.key"
  "${IN_HOST[@]}" munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
         --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed" --force
  write_conf "$dir" "$name" "$port" "$cpus"
  export SLURM_CONF=$dir/slurm.conf
  "${IN_HOST[@]}" slurmctld -c -i
  if ((${#NODE_NAMES[@]} > 1)); then
    local i
    for i in "${!NODE_NAMES[@]}"; do
      mkdir -p "$dir/spool/$name-node$i"
      in_host_with_cgroups "$REPO/scripts/testbed" exec "$TESTBED" "${NODE_HOSTS[$i]}" -- slurmd -N "$name-node$i"
    done
  elif ((${#IN_HOST[@]})); then
    in_host_with_cgroups "${IN_HOST[@]}" slurmd -N "$name-node"
  else
    slurmd -N "$name-node"
  fi
  local want=$(( ${#NODE_NAMES[@]} > 1 ? ${#NODE_NAMES[@]} : 1 ))
  for _ in $(seq 200); do
    if [[ $("${IN_HOST[@]}" sinfo -h -N -o '%t' 2>/dev/null | grep -cx idle) -eq $want ]]; then
      echo "SLURM_CONF=$dir/slurm.conf"
      return 0
    fi
    sleep 0.1
  done
  echo "slurm_testbed: cluster $name did not come up within 20 s; see $dir/log" >&2
  stop "$dir"
  exit 1
}

[[ $# -ge 2 ]] || usage
case $1 in
  start)
    [[ $# -ge 4 ]] || usage
    args=("$2" "$3" "$4")
    shift 4
    cpus=2
    if [[ $# -gt 0 && $1 != --* ]]; then cpus=$1; shift; fi
    while [[ $# -gt 0 ]]; do
      case $1 in
        --testbed) [[ $# -ge 3 ]] || usage; use_testbed "$2" "$3"; shift 3 ;;
        --private) [[ $# -ge 3 ]] || usage; PRIVATE=$2 KEEP=$3; shift 3 ;;
        *) usage ;;
      esac
    done
    [[ -z $PRIVATE || -n $TESTBED || ${#IN_HOST[@]} -gt 0 ]] || { echo "slurm_testbed: --private needs --testbed" >&2; exit 2; }
    start "${args[@]}" "$cpus" ;;
  stop) stop "$2" ;;
  kill) power_cut "$2" ;;
  *) usage ;;
esac
