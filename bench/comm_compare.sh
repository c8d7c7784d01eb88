#!/usr/bin/env bash
# make bench-comm-compare: all-reduce busbw of every crosstrain path on the same sizes, side by side, in one run.
#   NPROC=2 SIZES=4K:16M FACTOR=4
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/crosstrain}
NPROC=${NPROC:-2}
SIZES=${SIZES:-4K:16M}
FACTOR=${FACTOR:-4}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
paths=("gloo builtin" "gloo+shm builtin" "gloo ring" "gloo tree" "gloo hd" "gloo hierarchical")
for p in "${paths[@]}"; do
  read -r backend algo <<< "$p"
  "$BIN" bench comm --op allreduce --backend "$backend" --algo "$algo" --nproc "$NPROC" --sizes "$SIZES" \
    --step-factor "$FACTOR" --json "$tmp/$backend-$algo.json" > "$tmp/$backend-$algo.log"
done
# OpenMPI's MPI_Allreduce in the same run, through our MPI back end; then our algorithms on MPI's point-to-point
# messages (OpenMPI moves them through shared memory on one host).
if command -v mpirun > /dev/null; then
  for algo in builtin ring tree hd; do
    if mpirun --allow-run-as-root --oversubscribe -np "$NPROC" "$BIN" bench comm --op allreduce --backend mpi \
         --algo "$algo" --nproc "$NPROC" --sizes "$SIZES" --step-factor "$FACTOR" --json "$tmp/mpi-$algo.json" \
         > "$tmp/mpi-$algo.log" 2>&1; then
      paths+=("mpi $algo")
    fi
  done
fi
/usr/bin/python3 - "$tmp" "${paths[@]}" <<'PY'
import json, sys, os
tmp, paths = sys.argv[1], sys.argv[2:]
tables = {p: {r["size"]: r for r in json.load(open(os.path.join(tmp, p.replace(" ", "-") + ".json")))} for p in paths}
sizes = sorted(next(iter(tables.values())).keys())
print("# all-reduce busbw (GB/s), float sum, %d ranks; #wrong summed over all paths: %d" % (
    next(iter(next(iter(tables.values())).values()))["nranks"],
    sum(r["wrong"] for t in tables.values() for r in t.values())))
print("%12s " % "size(B)" + " ".join("%17s" % p for p in paths))
for s in sizes:
    print("%12d " % s + " ".join("%17.3f" % tables[p][s]["busbw"] for p in paths))
big = max(sizes)
best = max(paths, key=lambda p: tables[p][big]["busbw"])
print("best path at %d bytes: %s" % (big, best))
print("allreduce_%dMiB_busbw_ratio_vs_gloo=%.2f" % (big >> 20, tables[best][big]["busbw"] / tables["gloo builtin"][big]["busbw"]))
if "mpi builtin" in tables:
    print("allreduce_%dMiB_busbw_ratio_vs_mpi=%.2f" % (big >> 20, tables[best][big]["busbw"] / tables["mpi builtin"][big]["busbw"]))
    small = min(sizes)
    print("allreduce_%dB_time_ratio_vs_mpi=%.2f" % (small, min(tables[p][small]["time_us"] for p in paths if p != "mpi builtin") / tables["mpi builtin"][small]["time_us"]))
else:
    print("allreduce_%dMiB_busbw_ratio_vs_mpi=n/a (mpirun not available)" % (big >> 20))
PY
