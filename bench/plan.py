#!/usr/bin/env python3
"""make bench-plan: the planner's predicted step time against real training runs on this host (issue 16, item 5).

1. Calibrates this host once: `crosstrain plan --calibrate --out OUT/host.toml`.
2. Trains gpt-tiny (and a wider variant) for a few steps in 29 layouts: dp 1/2/4, tp, pp with every
   schedule, ZeRO 1-3, bf16, recompute, 4-rank mixes, and two runs across 2 emulated clusters (the WAN testbed,
   scripts/testbed: 100 Mbit/s, 25 ms one way; needs root): sync and DiLoCo.
3. Asks `crosstrain plan RECIPE CLUSTER --nproc N --set ... --json` for each (the same overrides as the run; the
   WAN runs get a cluster file of two one-device clusters joined by the testbed's link, written next to host.toml).
4. Prints name, predicted_s, measured_s, err_pct and the measured phases, then
     configs=N mean_abs_err_pct=X max_abs_err_pct=Y best_layout_hits=H/S
   best_layout_hits: for each search case (same model, batch and rank count), whether the layout the planner
   predicts fastest is also the one measured fastest.

measured_s: rank 0's step_time_s in metrics.jsonl, the median over the steps after the first WARM (5) and before
the last (which carries the final evaluation); for DiLoCo the mean time per step over the same steps (time_s
differences), so the outer exchanges count amortised, as the planner counts them.
Each training run holds /tmp/ct-build.lock (no build beside it); about 10-15 minutes in all. Column `other`: the
cores other processes used during the run (/proc/stat less the run's own CPU); a run above --quiet (0.3) is
repeated once, and the value shown is the last try's: read a large one as a noisy measurement.
Options: --predict-only (re-run the predictions against the last measurements: for tuning the model),
--only a,b (configurations by name), --steps, --host FILE (a cluster file instead of calibrating)."""
import argparse
import fcntl
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import tomllib

RECIPE = "recipes/gpt-tiny.toml"
LOCK = "/tmp/ct-build.lock"
WIDE = ["model.n_embd=256"]  # gpt-tiny at twice the width (about 3.4M parameters)
PIPE = ["train.micro_batches=4"]
WAN_RATE_MBIT, WAN_DELAY_MS = 100, 25
DILOCO = ["sync.mode=diloco", "sync.inner_steps=10", "sync.outer_lr=1.0", "sync.outer_momentum=0.5"]


def config(name, nproc, sets, case=None, wan=False, amortised=False):
    return {"name": name, "nproc": nproc, "sets": sets, "case": case, "wan": wan, "amortised": amortised}


# case: configurations with the same model, batch and rank count; the planner should rank them as measured.
CONFIGS = [
    config("dp1", 1, []),
    config("dp1-bf16", 1, ["train.precision=bf16"]),
    config("dp2", 2, [], "tiny/2"),
    config("tp2", 2, ["parallel.tp=2"], "tiny/2"),
    *[config(f"pp2-{s}", 2, ["parallel.pp=2", f"parallel.schedule={s}"] + PIPE, "tiny/2")
      for s in ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"]],
    *[config(f"dp2-zero{z}", 2, [f"parallel.zero={z}"], "tiny/2") for z in [1, 2, 3]],
    config("dp2-recompute", 2, ["train.recompute=full"], "tiny/2"),
    config("dp2-bf16", 2, ["train.precision=bf16"]),
    config("tp2-bf16", 2, ["parallel.tp=2", "train.precision=bf16"]),
    config("dp4", 4, [], "tiny/4"),
    config("dp2-tp2", 4, ["parallel.tp=2"], "tiny/4"),
    config("dp2-pp2", 4, ["parallel.pp=2"] + PIPE, "tiny/4"),
    config("tp4", 4, ["parallel.tp=4"], "tiny/4"),
    config("pp4", 4, ["parallel.pp=4"] + PIPE, "tiny/4"),
    config("pp2-tp2", 4, ["parallel.pp=2", "parallel.tp=2"] + PIPE, "tiny/4"),
    config("wide-dp2", 2, WIDE, "wide/2"),
    config("wide-tp2", 2, WIDE + ["parallel.tp=2"], "wide/2"),
    config("wide-pp2", 2, WIDE + ["parallel.pp=2"] + PIPE, "wide/2"),
    config("wide-dp4", 4, WIDE, "wide/4"),
    config("wide-dp2-tp2", 4, WIDE + ["parallel.tp=2"], "wide/4"),
    config("wide-pp2-tp2", 4, WIDE + ["parallel.pp=2", "parallel.tp=2"] + PIPE, "wide/4"),
    config("wan-sync", 2, ["sync.mode=sync"], "wan/2", wan=True),
    config("wan-diloco", 2, DILOCO, "wan/2", wan=True, amortised=True),
]


def common_sets(steps, run_dir):
    # No evaluation, sample or checkpoint inside the window; a fixed MFU denominator (no GEMM timing at start).
    return [f"train.steps={steps}", "train.eval_every=100000", "train.sample_tokens=0", "train.checkpoint_every=0",
            "train.eval_batches=1", "train.peak_flops_per_rank=1e11", "run.log_every=1", f"run.dir={run_dir}",
            "comm.timeout_s=120"]


def set_args(sets):
    out = []
    for s in sets:
        out += ["--set", s]
    return out


def train(args, c, run_dir, log):
    shutil.rmtree(run_dir, ignore_errors=True)
    sets = set_args(c["sets"] + common_sets(args.steps, run_dir))
    if c["wan"]:
        binary = os.path.abspath(args.bin)
        inner = (f"exec {binary} run --nnodes $CT_NNODES --node-rank $CT_NODE_RANK --nproc 1 "
                 f"--master $CT_MASTER_ADDR:29500 -- {binary} train {RECIPE} " + " ".join(sets))
        cmd = ["scripts/testbed", "run", "--name", f"bp{os.getpid() % 100000}", "--clusters", "2",
               "--hosts-per-cluster", "1", "--wan-rate", f"{WAN_RATE_MBIT}mbit", "--wan-delay-ms", str(WAN_DELAY_MS),
               "--timeout", "600", "--", "sh", "-c", inner]
        env = dict(os.environ, CROSSTRAIN_BUILD=os.path.dirname(args.bin) or ".")
    else:
        cmd = [args.bin, "train", RECIPE, "--nproc", str(c["nproc"])] + sets
        env = None
    # Holds the build lock itself (so the wall time below is the run's, not the wait), and counts the CPU the
    # rest of the machine used meanwhile: the busy time of all CPUs (/proc/stat) less this run's (its waited-for
    # processes' rusage), in cores. Other sessions' tests and tools do not take the lock.
    with open(LOCK, "a") as lock, open(log, "w") as f:
        fcntl.flock(lock, fcntl.LOCK_EX)
        busy0, ours0, t0 = cpu_busy_s(), children_cpu_s(), time.time()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=900).returncode
        wall = time.time() - t0
        other = max(0.0, (cpu_busy_s() - busy0) - (children_cpu_s() - ours0)) / wall
    return rc, other


def cpu_busy_s():
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    busy = sum(fields[:3]) + sum(fields[5:8])  # user nice system, irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(c, run_dir, warm):
    """(measured seconds per step, phases dict) from rank 0's metrics.jsonl; None when the run left too few."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return None, {}
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if "step_time_s" in r]
    if not rows:
        return None, {}
    last = max(r["step"] for r in rows)
    window = [r for r in rows if warm < r["step"] < last]
    if len(window) < 3:
        return None, {}
    if c["amortised"]:
        window.sort(key=lambda r: r["step"])
        before = [r for r in rows if r["step"] == window[0]["step"] - 1]
        start = before[0]["time_s"] if before else window[0]["time_s"] - window[0]["step_time_s"]
        measured = (window[-1]["time_s"] - start) / len(window)
    else:
        measured = statistics.median(r["step_time_s"] for r in window)
    # Phases, medians over the window: compute_time_s is cumulative (its step-to-step difference is this step's);
    # pipeline_compute_s is the busy time of rank 0's pipeline actions (the rest of its step is bubble and waits).
    by_step = {r["step"]: r for r in rows}
    phases = {}
    compute = [r["compute_time_s"] - by_step[r["step"] - 1]["compute_time_s"] for r in window
               if "compute_time_s" in r and r["step"] - 1 in by_step]
    if compute:
        phases["compute"] = statistics.median(compute)
    for key, short in [("pipeline_compute_s", "pipe_busy"), ("comm_time_s", "comm"),
                       ("exposed_comm_time_s", "exposed_comm"), ("sync_blocked_s", "sync_blocked")]:
        values = [r[key] for r in window if key in r]
        if values and any(values):
            phases[short] = statistics.median(values)
    return measured, phases


def find_key(obj, key):
    if isinstance(obj, dict):
        if key in obj and isinstance(obj[key], (int, float)):
            return obj[key]
        for v in obj.values():
            found = find_key(v, key)
            if found is not None:
                return found
    elif isinstance(obj, list):
        for v in obj:
            found = find_key(v, key)
            if found is not None:
                return found
    return None


def predict(args, c, cluster, run_dir):
    cmd = [args.bin, "plan", RECIPE, cluster, "--nproc", str(c["nproc"])]
    cmd += set_args(c["sets"] + common_sets(args.steps, run_dir)) + ["--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return None, (p.stderr.strip() or p.stdout.strip()).splitlines()[-1:] or ["failed"]
    try:
        out = json.loads(p.stdout)
    except json.JSONDecodeError:
        return None, ["no JSON: " + p.stdout[:200]]
    return find_key(out, "step_s"), out


# --- cluster files ----------------------------------------------------------------------------------------------

def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[ " + ", ".join(toml_value(x) for x in v) + " ]"
    raise TypeError(f"no TOML for {v!r}")


def toml_table(table, prefix, lines):
    """Writes `table` (plain keys first, then sub-tables, then arrays of tables) under the header `prefix`."""
    def is_table_array(v):
        return isinstance(v, list) and v and all(isinstance(x, dict) for x in v)
    plain = {k: v for k, v in table.items() if not isinstance(v, dict) and not is_table_array(v)}
    if prefix and (plain or not table):
        lines.append(f"\n[{prefix}]")
    for k, v in plain.items():
        lines.append(f"{k} = {toml_value(v)}")
    for k, v in table.items():
        if isinstance(v, dict):
            toml_table(v, f"{prefix}.{k}" if prefix else k, lines)
    for k, v in table.items():
        if is_table_array(v):
            name = f"{prefix}.{k}" if prefix else k
            for item in v:
                lines.append(f"\n[[{name}]]")
                sub = {kk: vv for kk, vv in item.items() if not isinstance(vv, dict)}
                for kk, vv in sub.items():
                    lines.append(f"{kk} = {toml_value(vv)}")
                for kk, vv in item.items():
                    if isinstance(vv, dict):
                        toml_table(vv, f"{name}.{kk}", lines)


def to_toml(table):
    lines = []
    toml_table(table, "", lines)
    return "\n".join(lines).lstrip() + "\n"


def write_wan_cluster(host_path, out_path):
    """This host's device and link, as two clusters of one host with one rank on one core each (the testbed runs
    one rank per emulated host; the two share this machine's 2 cores), joined by the testbed's wide-area link."""
    with open(host_path, "rb") as f:
        host = tomllib.load(f)
    base = host["clusters"][0]
    clusters = []
    for i in range(2):
        c = dict(base)
        c.update({"name": f"c{i}", "hosts": 1, "devices_per_host": 1, "compute_slots_per_host": 1})
        clusters.append(c)
    out = {k: v for k, v in host.items() if k not in ("clusters", "links", "wan")}
    out["name"] = "testbed"
    out["links"] = {"wan": {"latency_us": WAN_DELAY_MS * 1000.0, "bandwidth_gbps": WAN_RATE_MBIT / 1000.0}}
    out["clusters"] = clusters
    with open(out_path, "w") as f:
        f.write(to_toml(out))


# --- the report -------------------------------------------------------------------------------------------------

def fmt(x, spec):
    """`x` formatted, or "-" as wide as the spec's width when there is no value."""
    if isinstance(x, (int, float)) and not math.isnan(x):
        return format(x, spec)
    width = int(spec.split(".")[0] or 0)
    return "-".rjust(width)


def report(results):
    print(f"{'name':<16} {'ranks':>5} {'predicted_s':>12} {'measured_s':>11} {'err_pct':>8} {'other':>6}   "
          "measured phases (median s) | predicted phases")
    errors = []
    for r in results:
        err = float("nan")
        if r["predicted"] and r["measured"]:
            err = 100.0 * (r["predicted"] - r["measured"]) / r["measured"]
            errors.append(abs(err))
        phases = " ".join(f"{k}={v:.4f}" for k, v in r["phases"].items())
        if r.get("predicted_phases"):
            phases += " | predicted " + " ".join(f"{k}={v:.4f}" for k, v in r["predicted_phases"].items() if v)
        note = f"  [{r['note']}]" if r.get("note") else ""
        print(f"{r['name']:<16} {r['nproc']:>5} {fmt(r['predicted'], '12.4f')} {fmt(r['measured'], '11.4f')} "
              f"{fmt(err, '8.1f')} {fmt(r.get('other_cpu', float('nan')), '6.2f')}   {phases}{note}")
    hits, cases = 0, 0
    for case in sorted({r["case"] for r in results if r["case"]}):
        members = [r for r in results if r["case"] == case and r["predicted"] and r["measured"]]
        if len(members) < 2:
            continue
        cases += 1
        best_predicted = min(members, key=lambda r: r["predicted"])["name"]
        best_measured = min(members, key=lambda r: r["measured"])["name"]
        hits += best_predicted == best_measured
        print(f"# case {case}: {len(members)} layouts; predicted best {best_predicted}, measured best {best_measured}"
              f"{'' if best_predicted == best_measured else '  MISS'}")
    mean = statistics.mean(errors) if errors else float("nan")
    worst = max(errors) if errors else float("nan")
    print(f"configs={len(errors)} mean_abs_err_pct={fmt(mean, '.1f')} max_abs_err_pct={fmt(worst, '.1f')} "
          f"best_layout_hits={hits}/{cases}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/crosstrain")
    ap.add_argument("--out", default="runs/bench-plan")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warm", type=int, default=5, help="steps left out at the start")
    ap.add_argument("--only", default="", help="comma-separated configuration names")
    ap.add_argument("--host", default="", help="a cluster file for this host instead of calibrating")
    ap.add_argument("--predict-only", action="store_true", help="use the measurements of the last run")
    ap.add_argument("--quiet", type=float, default=0.3, help="cores of other work above which a run is repeated")
    ap.add_argument("--tries", type=int, default=2, help="runs per configuration at most (see --quiet)")
    ap.add_argument("--measure-only", action="store_true", help="no predictions (no `crosstrain plan` needed)")
    args = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    os.makedirs(args.out, exist_ok=True)
    configs = CONFIGS
    if args.only:
        names = args.only.split(",")
        unknown = [n for n in names if n not in {c["name"] for c in CONFIGS}]
        if unknown:
            sys.exit(f"bench-plan: unknown configuration(s) {unknown}; the names: {[c['name'] for c in CONFIGS]}")
        configs = [c for c in CONFIGS if c["name"] in names]
    is_root = os.geteuid() == 0
    host = args.host or os.path.join(args.out, "host.toml")
    if not args.measure_only and not args.host and not (args.predict_only and os.path.exists(host)):
        t0 = time.time()
        rc = subprocess.run(["flock", LOCK, args.bin, "plan", "--calibrate", "--out", host]).returncode
        if rc != 0:
            sys.exit(f"bench-plan: `{args.bin} plan --calibrate --out {host}` failed ({rc})")
        print(f"# calibrated this host in {time.time() - t0:.0f} s: {host}", flush=True)
    wan_cluster = os.path.join(args.out, "wan.toml")
    if not args.measure_only:
        write_wan_cluster(host, wan_cluster)
    results = []
    start = time.time()
    for c in configs:
        run_dir = os.path.join(args.out, c["name"])
        r = {"name": c["name"], "nproc": c["nproc"], "case": c["case"], "predicted": None, "measured": None,
             "phases": {}, "note": ""}
        if c["wan"] and not is_root:
            r["note"] = "skipped: the WAN testbed needs root"
            results.append(r)
            continue
        other_path = run_dir + ".other_cpu"
        if not args.predict_only:
            # A run beside other sessions' work (more than --quiet cores of it) is run again, up to --tries times.
            for attempt in range(args.tries):
                t0 = time.time()
                rc, other = train(args, c, run_dir, run_dir + ".log")
                print(f"# {c['name']}: trained in {time.time() - t0:.0f} s (rc {rc}), other processes used "
                      f"{other:.2f} cores meanwhile", file=sys.stderr, flush=True)
                if rc != 0 or other <= args.quiet:
                    break
                time.sleep(10)
            if rc != 0:
                r["note"] = f"training failed ({rc}): {run_dir}.log"
            with open(other_path, "w") as f:
                f.write(f"{other:.3f}\n")
        if os.path.exists(other_path):
            r["other_cpu"] = float(open(other_path).read())
        r["measured"], r["phases"] = measure(c, run_dir, args.warm)
        if not args.measure_only:
            r["predicted"], out = predict(args, c, wan_cluster if c["wan"] else host, run_dir)
            if r["predicted"] is None:
                r["note"] = (r["note"] + "; " if r["note"] else "") + "plan: " + " ".join(map(str, out))[:160]
            else:
                time_parts = out.get("time", {}) if isinstance(out, dict) else {}
                r["predicted_phases"] = {k[:-2]: v for k, v in time_parts.items()
                                         if k.endswith("_s") and k != "step_s" and isinstance(v, (int, float))}
                with open(run_dir + ".plan.json", "w") as f:
                    json.dump(out, f, indent=1)
        results.append(r)
    print(f"# gpt-tiny ({RECIPE}), {args.steps} steps, medians after {args.warm}; "
          f"{time.time() - start:.0f} s of runs; predictions from {host}")
    report(results)


if __name__ == "__main__":
    main()
