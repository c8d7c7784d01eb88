#!/usr/bin/env python3
"""Cost of always-on traces: gpt-tiny on 2 ranks with obs.trace on and off, alternating rounds in one session
(the machine is shared and noisy: only the ratio within a round pair means something), and the size of the
trace files per rank per 1,000 steps. Prints trace_overhead_pct= and trace_mb_per_1000_steps= (targets: at most
2% and at most 5 MB)."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def run(binary, recipe, run_dir, steps, trace, nproc):
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [binary, "train", recipe, "--nproc", str(nproc), "--set", f"run.dir={run_dir}",
           "--set", f"train.steps={steps}", "--set", "train.sample_tokens=0", "--set", "train.eval_every=0",
           "--set", f"obs.trace={'true' if trace else 'false'}", "--set", f"run.log_every={steps}",
           "--set", "train.peak_flops_per_rank=1e11"]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"bench-trace: the run failed:\n{done.stdout}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    # The median step of the steady part (the first steps warm up allocators and caches; the median ignores the
    # steps another process on the machine preempted).
    steady = [r for r in rows if r["step"] > steps // 10]
    tokens_per_s = statistics.median(r["tokens_per_s"] for r in steady)
    sizes = []
    traces = os.path.join(run_dir, "traces")
    if trace:
        sizes = [os.path.getsize(os.path.join(traces, f)) for f in sorted(os.listdir(traces))]
    return tokens_per_s, sizes


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bin", default="build/crosstrain")
    p.add_argument("--recipe", default="recipes/gpt-tiny.toml")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--nproc", type=int, default=2)
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="bench-trace-")
    ratios, sizes = [], []
    print(f"gpt-tiny, {a.nproc} ranks, {a.steps} steps per run, {a.rounds} rounds of (off, on) and (on, off)")
    print(f"{'round':>5} {'off tok/s':>10} {'on tok/s':>10} {'overhead':>9}   (median step of each run)")
    for r in range(a.rounds):
        # Alternate the order too, so that a trend in the machine's load does not favour one side.
        order = [False, True] if r % 2 == 0 else [True, False]
        result = {}
        for trace in order:
            tps, s = run(a.bin, a.recipe, os.path.join(work, f"r{r}-{int(trace)}"), a.steps, trace, a.nproc)
            result[trace] = tps
            sizes += s
        overhead = 100 * (result[False] - result[True]) / result[False]
        ratios.append(overhead)
        print(f"{r:>5} {result[False]:>10.0f} {result[True]:>10.0f} {overhead:>8.2f}%")
    shutil.rmtree(work, ignore_errors=True)
    mb_per_1000 = max(sizes) / a.steps * 1000 / 1e6
    print(f"trace_overhead_pct={statistics.median(ratios):.2f} trace_mb_per_1000_steps={mb_per_1000:.2f} "
          f"(largest rank file; targets: <= 2% and <= 5 MB)")


if __name__ == "__main__":
    main()
