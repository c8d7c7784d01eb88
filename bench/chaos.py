#!/usr/bin/env python3
"""make bench-chaos: elastic gpt-tiny on 4 replicas while a driver kills and stops random ranks.

Three runs of the same recipe and step count: plain (no membership), elastic without faults (the cost of
membership), and elastic under chaos (SIGKILL of a random rank every few seconds, now and then a SIGSTOP: a hung
rather than dead rank; the launcher restarts the killed ranks and they rejoin). Figures come from the launcher's
and the ranks' own log lines (each carries its UTC time, [2026-12-06T09:14:44.123Z]) and from metrics.jsonl:
  detect   kill -> the coordinator's failure generation that drops the rank
  resume   that generation -> the next step committed
  lost     steps aborted per failure (the step in flight)
  heal     state bytes / transfer time of each rejoin, next to `crosstrain bench comm --op sendrecv` for that size
  loss     final validation loss of the chaos run against a plain run with the same token budget (the chaos run
           trains on fewer sequences while replicas are missing; that run has as many steps of the full batch as
           the chaos run's tokens fill), and against the plain run of the same step count
"""
import argparse, datetime, json, os, random, re, signal, statistics, subprocess, sys, time

def now_ms():
    return int(time.time() * 1000)

def train_cmd(args, run_dir, elastic, extra=()):
    cmd = [args.bin, "train", args.recipe, "--nproc", str(args.nproc), "--set", f"run.dir={run_dir}",
           "--set", f"train.steps={args.steps}", "--set", "train.sample_tokens=0", "--set", f"train.eval_every={args.steps}",
           "--set", "train.checkpoint_every=50", "--set", "run.log_every=1000"]
    for setting in args.set:  # the same in every run: plain, fault-free elastic and chaos
        cmd += ["--set", setting]
    if elastic:
        cmd += ["--max-restarts", "1000", "--set", f"elastic.heartbeat_ms={args.heartbeat_ms}",
                "--set", f"elastic.failure_timeout_ms={args.failure_timeout_ms}"]
    return cmd + list(extra)

def metrics(run_dir):
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    tokens = sum(r["tokens_per_s"] * r["step_time_s"] for r in rows)
    tps = statistics.median(r["tokens_per_s"] for r in rows[5:]) if len(rows) > 10 else 0
    val = next((r["val_loss"] for r in reversed(rows) if r.get("val_loss", -1) >= 0), float("nan"))
    return {"rows": len(rows), "tokens": tokens, "tokens_per_s": tps, "val_loss": val}

def rank_pids(launcher_pid):
    """rank -> pid of the launcher's children, from their RANK variable."""
    out = {}
    try:
        children = open(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read().split()
    except OSError:
        return out
    for pid in children:
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for kv in env:
            if kv.startswith(b"RANK="):
                out[int(kv[5:])] = int(pid)
    return out

def run_plain(args, name, elastic):
    run_dir = os.path.join(args.dir, name)
    subprocess.run(["rm", "-rf", run_dir])
    t0 = time.time()
    p = subprocess.run(train_cmd(args, run_dir, elastic), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"bench-chaos: the {name} run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    m = metrics(run_dir)
    m["wall_s"] = time.time() - t0
    return m

def run_chaos(args):
    run_dir = os.path.join(args.dir, "chaos")
    subprocess.run(["rm", "-rf", run_dir])
    log_path = os.path.join(args.dir, "chaos.log")
    log = open(log_path, "w")
    t0 = time.time()
    p = subprocess.Popen(train_cmd(args, run_dir, True), stdout=log, stderr=subprocess.STDOUT)
    faults = []  # (t_ms, rank, kind)
    rng = random.Random(args.seed)
    next_fault = time.time() + args.first_fault_s
    training = False  # faults start once the first step committed: a rank killed while the job still starts up
                      # is not a failure of training (it showed as a 15 s "detection" by the next failure generation)
    while p.poll() is None:
        time.sleep(0.05)
        if not training:
            log.flush()
            training = COMMIT.search(open(log_path).read()) is not None
            if not training:
                continue
        if time.time() < next_fault:
            continue
        pids = rank_pids(p.pid)
        if len(pids) < args.nproc:  # a rank is restarting: wait until the job is whole again
            next_fault = time.time() + 0.5
            continue
        rank = rng.choice(sorted(pids))
        kind = "stop" if rng.random() < args.stop_fraction else "kill"
        try:
            os.kill(pids[rank], signal.SIGSTOP if kind == "stop" else signal.SIGKILL)
        except ProcessLookupError:
            continue
        faults.append((now_ms(), rank, kind))
        next_fault = time.time() + rng.uniform(args.min_gap_s, args.max_gap_s)
    log.close()
    if p.returncode != 0:
        sys.exit(f"bench-chaos: the chaos run failed ({p.returncode}); see {log_path}")
    m = metrics(run_dir)
    m["wall_s"] = time.time() - t0
    return m, faults, open(log_path).read()

# Log lines carry UTC times with milliseconds, "[2026-12-06T09:14:44.123Z]"; the analysis works in epoch ms.
STAMP = r"\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)\]"
GEN = re.compile(r"crosstrain elastic: " + STAMP + r" generation (\d+) \((\w+)\): (.*)")
COMMIT = re.compile(STAMP + r" rank \d+: generation (\d+): step (\d+) committed")
ABORT = re.compile(STAMP + r" rank \d+: step (\d+) aborted in generation (\d+)")

def epoch_ms(stamp):
    return round(datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)
HEAL = re.compile(r"healed from replica \d+: (\d+) bytes in ([0-9.]+) s \(heal_MBps=([0-9.]+)\)")

def analyse(faults, text):
    gens = [(epoch_ms(t), int(g), why, rest) for t, g, why, rest in GEN.findall(text)]
    commits = sorted((epoch_ms(t), int(g), int(s)) for t, g, s in COMMIT.findall(text))
    aborts = sorted({(int(g), int(s)): epoch_ms(t) for t, s, g in ABORT.findall(text)}.items(), key=lambda x: x[1])
    rows = []
    for t_fault, rank, kind in faults:
        hit = next(((t, g) for t, g, why, rest in gens
                    if why == "failure" and t >= t_fault and re.search(rf"rank {rank} (exited|silent|left)", rest)), None)
        if not hit:
            rows.append({"t": t_fault, "rank": rank, "kind": kind, "detect_ms": None})
            continue
        t_detect, g = hit
        commit = next((t for t, gg, s in commits if t >= t_detect and gg >= g), None)
        later = next((t for t, gg, why, rest in gens if t > t_detect and why == "failure"), None)
        # A rank may log its abort a moment before the coordinator logs the generation that caused it: 50 ms of slack.
        lost = len([1 for (gg, s), t in aborts if t_detect - 50 <= t < (later or 1 << 62) - 50])
        rows.append({"t": t_fault, "rank": rank, "kind": kind, "detect_ms": t_detect - t_fault,
                     "resume_ms": (commit - t_detect) if commit else None, "lost": lost})
    heals = [(int(b), float(s), float(r)) for b, s, r in HEAL.findall(text)]
    return rows, heals

def p99(values):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(0.99 * (len(v) - 1))))] if v else float("nan")

def sendrecv_GBps(bin_path, size):
    out = subprocess.run([bin_path, "bench", "comm", "--op", "sendrecv", "--nproc", "2", "--sizes", f"{size}:{size}"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == str(size):
            return float(f[6])
    return float("nan")

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/crosstrain")
    ap.add_argument("--recipe", default="recipes/gpt-tiny.toml")
    ap.add_argument("--dir", default="runs/bench-chaos")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=int(os.environ.get("STEPS", 700)))
    ap.add_argument("--heartbeat-ms", type=int, default=100)
    ap.add_argument("--failure-timeout-ms", type=int, default=500)
    ap.add_argument("--first-fault-s", type=float, default=5)
    ap.add_argument("--min-gap-s", type=float, default=2.5)
    ap.add_argument("--max-gap-s", type=float, default=5)
    ap.add_argument("--stop-fraction", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", 2)))
    ap.add_argument("--set", action="append", default=os.environ.get("SET", "").split(),
                    help="KEY=VALUE for every run, e.g. --set sync.mode=diloco --set sync.clusters=2 (env SET: "
                         "space-separated)")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    print(f"# bench-chaos: {args.recipe} {' '.join(args.set)}, {args.nproc} replicas, {args.steps} steps; heartbeat {args.heartbeat_ms} ms, "
          f"failure timeout {args.failure_timeout_ms} ms; a fault every {args.min_gap_s}-{args.max_gap_s} s "
          f"({int(100 * args.stop_fraction)}% SIGSTOP, the rest SIGKILL)", flush=True)
    # The cost of membership: plain and fault-free elastic runs alternate, so the machine's noise hits both.
    plains, cleans = [], []
    for r in range(args.rounds):
        plains.append(run_plain(args, "plain", False))
        cleans.append(run_plain(args, "elastic-clean", True))
        print(f"# round {r + 1}: plain {plains[-1]['tokens_per_s']:.0f} tokens/s, elastic {cleans[-1]['tokens_per_s']:.0f} "
              f"tokens/s (val {plains[-1]['val_loss']:.4f} / {cleans[-1]['val_loss']:.4f})", flush=True)
    plain = plains[0]
    plain_tps = statistics.mean(p["tokens_per_s"] for p in plains)
    clean_tps = statistics.mean(c["tokens_per_s"] for c in cleans)
    cost = 100 * (1 - clean_tps / plain_tps)
    print(f"# membership cost: {cost:+.1f}% tokens/s (mean of {args.rounds} rounds)", flush=True)
    chaos, faults, text = run_chaos(args)
    rows, heals = analyse(faults, text)
    # The fault-free run with the chaos run's token budget: fewer steps of the full global batch.
    ratio = chaos["tokens"] / plain["tokens"]
    budget_steps = max(1, round(args.steps * ratio))
    same_tokens = run_plain(argparse.Namespace(**{**vars(args), "steps": budget_steps}), "plain-same-tokens", False)
    print(f"# plain with the chaos run's tokens ({budget_steps} steps): val {same_tokens['val_loss']:.4f}", flush=True)
    print(f"# chaos:   {chaos['wall_s']:.0f} s, val {chaos['val_loss']:.4f}, {chaos['tokens'] / plain['tokens']:.3f} of "
          f"the plain run's tokens")
    print(f"#{'t_ms':>15} {'rank':>5} {'kind':>5} {'detect_ms':>10} {'resume_ms':>10} {'lost':>5}")
    for r in rows:
        print(f" {r['t']:>15} {r['rank']:>5} {r['kind']:>5} {str(r.get('detect_ms')):>10} {str(r.get('resume_ms')):>10} "
              f"{str(r.get('lost')):>5}")
    detected = [r for r in rows if r["detect_ms"] is not None]
    heal_bytes = heals[0][0] if heals else 0
    heal_rate = statistics.median(h[2] for h in heals) if heals else float("nan")
    ref = sendrecv_GBps(args.bin, heal_bytes) * 1000 if heal_bytes else float("nan")
    print(f"# heals: {len(heals)}, {heal_bytes} bytes each, median {heal_rate:.0f} MB/s; bench comm sendrecv of that size: "
          f"{ref:.0f} MB/s (ratio {heal_rate / ref:.2f})")
    print(f"# undetected faults: {len(rows) - len(detected)} (a fault on a rank that was already leaving)")
    print(f"detect_p99_ms={p99([r['detect_ms'] for r in detected])} "
          f"resume_p99_ms={p99([r['resume_ms'] for r in detected if r.get('resume_ms') is not None])} "
          f"steps_lost_max={max((r['lost'] for r in detected), default=0)} heal_MBps={heal_rate:.0f} kills={len(faults)} "
          f"loss_vs_clean={100 * (chaos['val_loss'] / same_tokens['val_loss'] - 1):+.2f}% "
          f"loss_vs_same_steps={100 * (chaos['val_loss'] / plain['val_loss'] - 1):+.2f}% "
          f"membership_cost={cost:+.1f}%")

if __name__ == "__main__":
    main()
