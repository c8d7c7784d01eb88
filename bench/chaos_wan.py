#!/usr/bin/env python3
"""make bench-chaos-wan: elastic DiLoCo across emulated clusters while a driver breaks ranks, hosts, clusters and links.

The testbed (scripts/testbed): 3 clusters x 2 hosts, wide-area links of 100 Mbit/s and 25 ms one way; one rank per
host, one launcher per host (node 0 holds the store, node 1 the standby: crosstrain run --standby). gpt-tiny with
DiLoCo across the clusters and tensor parallelism (tp=2) across the two hosts of each cluster, so a cluster is one
replica. Two runs of the same steps:
  clean   no faults: tokens per second and the validation loss curve (evaluated every --eval-every steps)
  chaos   a fault every --min-gap-s..--max-gap-s seconds, at random: SIGKILL of a rank (its launcher restarts
          it), SIGSTOP of a rank (a hung rank: excluded, ended and restarted), SIGKILL of a whole host (launcher
          and rank; the host is started again --down-s later), of a whole cluster (both hosts, started again
          --down-s later), and a cut of a cluster's wide-area link for --cut-s seconds. Nodes 0 and 1 hold the
          stores and are never killed as hosts (ElasticCli.TheNodeThatStartedTheJobIsKilledAndTrainingContinues
          covers losing node 0); their ranks are.
Printed: goodput (committed tokens per second of the chaos run over the clean run's), faults, lost_tokens_pct
(tokens the chaos run did not train because replicas were out, against the clean run's at the same steps),
rejoin_p99_s (from the end of a fault, or the restart of what it killed, to the generation that took the replica
back), loss_vs_clean (the chaos run's final validation loss against the clean run's at the same token count,
interpolated on its curve), rss_growth_mb (the largest growth of a rank process's resident size from its first
generation to its end, as each rank reports it).
"""
import argparse, datetime, json, os, random, re, signal, statistics, subprocess, sys, time

STAMP = r"\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)\]"
GEN = re.compile(r"crosstrain elastic: " + STAMP + r" generation (\d+) \((\w+)\): \d+ replicas? \(([0-9,]*)\)")
START = re.compile(r"crosstrain elastic: " + STAMP + r" generation 1 \(start\)")
FINISHED = re.compile(r"crosstrain elastic: " + STAMP + r" training finished on rank")
RSS = re.compile(r"rank (\d+): process: rss (\d+) MB.*\(at its first: rss (\d+) MB")


def epoch_s(stamp):
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class Testbed:
    def __init__(self, args):
        self.tb, self.name, self.args = args.testbed, args.name, args
        self.hosts = [(c, h) for c in range(args.clusters) for h in range(2)]

    def up(self):
        subprocess.run([self.tb, "down", self.name], capture_output=True)
        subprocess.run([self.tb, "up", "--name", self.name, "--clusters", str(self.args.clusters),
                        "--hosts-per-cluster", "2", "--wan-rate", "100mbit", "--wan-delay-ms", "25",
                        "--build", self.args.build], check=True, capture_output=True)

    def down(self):
        subprocess.run([self.tb, "down", self.name], capture_output=True)

    def link(self, verb, cluster):
        subprocess.run([self.tb, verb, self.name, "--cluster", str(cluster)], check=True, capture_output=True)


class Job:
    """One launcher per host of the testbed, each in a session of its own (killed as a whole: a host's loss)."""

    def __init__(self, args, tb, run_dir, tag):
        self.args, self.tb, self.run_dir, self.tag = args, tb, run_dir, tag
        self.procs, self.logs = {}, {}

    def command(self, node):
        a = self.args
        sets = [f"run.dir={self.run_dir}", f"train.steps={a.steps}", "model.n_layer=2", "model.n_embd=64",
                "model.n_head=4", "model.block_size=64", "train.global_batch=12", "train.warmup_steps=10",
                f"train.eval_every={a.eval_every}", "train.eval_batches=4", "train.sample_tokens=0",
                "train.checkpoint_every=100", "run.log_every=1000", "comm.timeout_s=30", "sync.mode=diloco",
                f"sync.clusters={a.clusters}", f"sync.inner_steps={a.inner_steps}", "parallel.tp=2",
                "elastic.enabled=true", "train.peak_flops_per_rank=1e9",
                # Six ranks, the relay and the shapers share 2 cores here: a 500 ms failure timeout would declare
                # ranks that only waited for a core dead. Two seconds, as across a real wide-area link.
                f"elastic.failure_timeout_ms={a.failure_timeout_ms}", f"elastic.heartbeat_ms={a.failure_timeout_ms // 5}"] + a.set
        train = [a.bin, "train", a.recipe] + [w for s in sets for w in ("--set", s)]
        master, standby = "10.77.0.1:29500", "10.77.0.2:29501"
        return ([self.tb.tb, "exec", self.tb.name, str(node), "--", "env", "OMP_NUM_THREADS=1",
                 "OPENBLAS_NUM_THREADS=1", a.bin, "run", "--nnodes", str(len(self.tb.hosts)), "--node-rank",
                 str(node), "--nproc", "1", "--master", master, "--standby", standby, "--max-restarts", "1000",
                 "--timeout", "60", "--"] + train)

    def start(self, node):
        path = os.path.join(self.args.dir, f"{self.tag}-node{node}.log")
        log = open(path, "a")
        self.logs[node] = path
        self.procs[node] = subprocess.Popen(self.command(node), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def kill(self, node):
        p = self.procs.get(node)
        if p and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # the launcher; its rank dies with it (PR_SET_PDEATHSIG)
            p.wait()

    def rank_pid(self, node):
        """The rank process under a host's launcher (ip netns exec execs into it)."""
        p = self.procs.get(node)
        if not p or p.poll() is not None:
            return None
        try:
            kids = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
        except OSError:
            return None
        return int(kids[0]) if kids else None

    def running(self):
        return {n for n, p in self.procs.items() if p.poll() is None}

    def text(self):
        return "".join(open(p, errors="replace").read() for p in self.logs.values())


def metrics(run_dir):
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    tokens = [r["tokens_per_s"] * r["step_time_s"] for r in rows]
    curve, total = [], 0.0
    for r, t in zip(rows, tokens):
        total += t
        if r.get("val_loss", -1) is not None and r.get("val_loss", -1) >= 0:
            curve.append((total, r["val_loss"]))
    return {"rows": len(rows), "tokens": total, "curve": curve,
            "val_loss": curve[-1][1] if curve else float("nan")}


def run(args, tb, tag, chaos):
    run_dir = os.path.join(args.dir, tag)
    subprocess.run(["rm", "-rf", run_dir])
    for n in range(len(tb.hosts)):
        open(os.path.join(args.dir, f"{tag}-node{n}.log"), "w").close()
    job = Job(args, tb, run_dir, tag)
    for n in range(len(tb.hosts)):
        job.start(n)
    t0 = time.time()
    faults, pending = [], []  # faults: (t_end, replica, kind); pending: (due, action, arg)
    rng = random.Random(args.seed)
    next_fault = None
    issued = 0
    deadline = t0 + args.timeout_s
    while job.procs[0].poll() is None and time.time() < deadline:
        time.sleep(0.1)
        now = time.time()
        for item in [p for p in pending if p[0] <= now]:
            pending.remove(item)
            _, action, arg = item
            if action == "heal":
                tb.link("heal", arg)
                faults.append((time.time(), arg, "cut"))
            else:  # restart the hosts of a killed host or cluster
                for node in arg:
                    job.start(node)
                faults.append((time.time(), arg[0] // 2, action))
        if not chaos:
            continue
        if next_fault is None:
            rows = os.path.join(run_dir, "metrics.jsonl")
            if os.path.exists(rows) and sum(1 for _ in open(rows)) >= 5:
                next_fault = now + args.first_fault_s
            continue
        if now < next_fault or pending:
            continue
        kind = rng.choice(args.kinds.split(","))
        cluster = rng.randrange(1, args.clusters)  # cluster 0 holds the stores
        node = rng.choice([n for n in range(len(tb.hosts)) if kind in ("kill", "stop") or n >= 2])
        if kind in ("kill", "stop"):
            pid = job.rank_pid(node)
            if pid is None:
                next_fault = now + 1
                continue
            os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            faults.append((time.time(), node // 2, kind))
        elif kind == "host":
            job.kill(node)
            pending.append((now + args.down_s, "host", [node]))
        elif kind == "cluster":
            for n in (2 * cluster, 2 * cluster + 1):
                job.kill(n)
            pending.append((now + args.down_s, "cluster", [2 * cluster, 2 * cluster + 1]))
        elif kind == "cut":
            tb.link("cut", cluster)
            pending.append((now + args.cut_s, "heal", cluster))
        issued += 1
        print(f"#   {now - t0:7.1f} s: {kind} {'cluster ' + str(cluster) if kind in ('cluster', 'cut') else 'node ' + str(node)}",
              flush=True)
        next_fault = now + rng.uniform(args.min_gap_s, args.max_gap_s)
    for _, action, arg in pending:  # the run ended first
        if action == "heal":
            tb.link("heal", arg)
    finished = job.procs[0].poll() == 0
    for n in list(job.procs):
        try:
            job.procs[n].wait(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill(n)
    wall = time.time() - t0
    if not finished:
        sys.exit(f"bench-chaos-wan: the {tag} run did not finish (node 0: {job.procs[0].returncode}); see "
                 f"{args.dir}/{tag}-node*.log")
    m = metrics(run_dir)
    text = job.text()
    # Training time: from the first generation to the end of training, as the coordinator logged them (not the
    # launchers' start-up and exit, which neither run is about).
    start, end = START.search(text), FINISHED.search(text)
    m["wall_s"] = epoch_s(end.group(1)) - epoch_s(start.group(1)) if start and end else wall
    m["faults_issued"] = issued
    return m, faults, text


def rejoins(faults, text):
    """Seconds from the end of each fault to the first generation after it that holds its replica."""
    gens = sorted((epoch_s(t), int(g), {int(x) for x in reps.split(",") if x}) for t, g, why, reps in GEN.findall(text))
    out = []
    for t_end, replica, kind in faults:
        back = next((t for t, g, reps in gens if t >= t_end and replica in reps), None)
        out.append(None if back is None else back - t_end)
    return out


def loss_at(curve, tokens):
    if not curve:
        return float("nan")
    for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
        if t0 <= tokens <= t1:
            return l0 + (l1 - l0) * (tokens - t0) / max(t1 - t0, 1e-9)
    return curve[0][1] if tokens < curve[0][0] else curve[-1][1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/crosstrain")
    ap.add_argument("--build", default="build")
    ap.add_argument("--testbed", default="scripts/testbed")
    ap.add_argument("--recipe", default="recipes/gpt-tiny.toml")
    ap.add_argument("--dir", default="runs/bench-chaos-wan")
    ap.add_argument("--name", default=f"ctchaos{os.getpid() % 100000}")
    ap.add_argument("--clusters", type=int, default=3)
    ap.add_argument("--steps", type=int, default=int(os.environ.get("STEPS", 1500)))
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--failure-timeout-ms", type=int, default=2000)
    ap.add_argument("--first-fault-s", type=float, default=10)
    ap.add_argument("--min-gap-s", type=float, default=15)
    ap.add_argument("--max-gap-s", type=float, default=45)
    ap.add_argument("--down-s", type=float, default=10, help="how long a killed host or cluster stays down")
    ap.add_argument("--cut-s", type=float, default=30)
    ap.add_argument("--kinds", default="kill,stop,host,cluster,cut")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout-s", type=float, default=3600)
    ap.add_argument("--set", action="append", default=os.environ.get("SET", "").split())
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench-chaos-wan: the testbed needs root (network namespaces)")
    args.bin, args.testbed, args.build = (os.path.abspath(p) for p in (args.bin, args.testbed, args.build))
    args.recipe, args.dir = os.path.abspath(args.recipe), os.path.abspath(args.dir)
    os.makedirs(args.dir, exist_ok=True)
    tb = Testbed(args)
    print(f"# bench-chaos-wan: {args.clusters} clusters x 2 hosts, 100mbit 25 ms; gpt-tiny DiLoCo (H={args.inner_steps}) "
          f"with tp=2 in each cluster, {args.steps} steps; a fault every {args.min_gap_s}-{args.max_gap_s} s "
          f"({args.kinds}); down {args.down_s} s, cuts {args.cut_s} s", flush=True)
    tb.up()
    try:
        clean, _, _ = run(args, tb, "clean", False)
        print(f"# clean: {clean['wall_s']:.0f} s, {clean['tokens'] / clean['wall_s']:.0f} tokens/s, val "
              f"{clean['val_loss']:.4f}", flush=True)
        chaos, faults, text = run(args, tb, "chaos", True)
    finally:
        tb.down()
    goodput = (chaos["tokens"] / chaos["wall_s"]) / (clean["tokens"] / clean["wall_s"])
    lost = 100 * (1 - chaos["tokens"] / clean["tokens"])
    back = rejoins(faults, text)
    came_back = sorted(b for b in back if b is not None)
    p99 = came_back[min(len(came_back) - 1, int(round(0.99 * (len(came_back) - 1))))] if came_back else float("nan")
    same_tokens = loss_at(clean["curve"], chaos["tokens"])
    growth = max((int(end) - int(first) for _, end, first in RSS.findall(text)), default=float("nan"))
    print(f"# chaos: {chaos['wall_s']:.0f} s, {chaos['tokens'] / chaos['wall_s']:.0f} tokens/s, val {chaos['val_loss']:.4f}; "
          f"the clean run's val at the same tokens {same_tokens:.4f}; {len(faults)} faults, "
          f"{len(back) - len(came_back)} replicas not back by the end")
    print(f"goodput={goodput:.3f} faults={chaos['faults_issued']} lost_tokens_pct={lost:.1f} rejoin_p99_s={p99:.1f} "
          f"loss_vs_clean={100 * (chaos['val_loss'] / same_tokens - 1):+.2f}% rss_growth_mb={growth}")


if __name__ == "__main__":
    main()
