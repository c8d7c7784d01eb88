#!/usr/bin/env python3
"""make bench-scale: a GPT of about 370M parameters (24 layers, width 1024, 16 heads, vocabulary 32768, context
256) trained for a few steps on 4 ranks (pp=2 x tp=2), each rank's peak RSS next to a single process's, and full
activation recomputation against none on the same 4 ranks.

Each rank's peak RSS is its VmHWM, read from /proc while the job runs (ranks are the launcher's children; RANK
is in their environment). The single process trains the same model and batch. Targets (issue 15): no rank above
40% of the single process; recompute_activation_bytes_ratio <= 0.4 (activation_peak_bytes, counted at the
allocator: saved tensors and backward's temporaries, not RSS) and recompute_step_time_ratio <= 1.4."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MODEL = {"model.n_layer": 24, "model.n_embd": 1024, "model.n_head": 16, "model.vocab_size": 32768,
         "model.block_size": 256}


def rank_of(pid):
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def high_water_mb(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            children = open(f"/proc/{p}/task/{p}/children").read().split()
        except OSError:
            continue
        out += [int(c) for c in children]
        todo += [int(c) for c in children]
    return out


def train(binary, run_dir, nproc, steps, extra):
    """Runs one job; returns (metrics rows of rank 0, {rank: peak RSS MB})."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [binary, "train", "recipes/gpt-tiny.toml", "--nproc", str(nproc), "--set", f"run.dir={run_dir}",
           "--set", f"train.steps={steps}", "--set", "train.global_batch=4", "--set", "train.eval_every=0",
           "--set", "train.sample_tokens=0", "--set", "train.checkpoint_every=0", "--set", "run.log_every=1",
           "--set", "train.peak_flops_per_rank=1e11", "--set", "train.warmup_steps=1", "--set", "comm.timeout_s=300"]
    for k, v in {**MODEL, **extra}.items():
        cmd += ["--set", f"{k}={v}"]
    log = open(run_dir + ".log", "w")
    job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    peaks = {}
    while job.poll() is None:
        pids = descendants(job.pid) if nproc > 1 else [job.pid]
        for pid in pids:
            rank = rank_of(pid) if nproc > 1 else 0
            hwm = high_water_mb(pid)
            if rank is not None and hwm is not None:
                peaks[rank] = max(peaks.get(rank, 0), hwm)
        time.sleep(0.2)
    if job.returncode != 0:
        sys.exit(f"bench-scale: {' '.join(cmd)} failed:\n" + open(run_dir + ".log").read()[-3000:])
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return rows, peaks


def steady(rows):
    return [r for r in rows if r["step"] >= 2] or rows


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bin", default=os.environ.get("BIN", "build/crosstrain"))
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="bench-scale-")
    layout = {"parallel.pp": 2, "parallel.tp": 2, "parallel.sequence_parallel": "true", "train.micro_batches": 4}
    print("# bench-scale: GPT 24L d1024 h16 V32768 T256, 4 sequences per step, fp32 AdamW", flush=True)
    single_rows, single_peak = train(a.bin, os.path.join(work, "single"), 1, 2, {})
    params = single_rows[-1].get("param_bytes", 0) / 4
    print(f"parameters={params / 1e6:.1f}M single_process_peak_rss_mb={single_peak[0]:.0f}", flush=True)
    runs = {}
    for mode in ["none", "full"]:
        rows, peaks = train(a.bin, os.path.join(work, mode), 4, a.steps, {**layout, "train.recompute": mode})
        runs[mode] = rows
        for rank in sorted(peaks):
            print(f"recompute={mode} rank={rank} peak_rss_mb={peaks[rank]:.0f} "
                  f"fraction_of_single={peaks[rank] / single_peak[0]:.3f}", flush=True)
        if mode == "none":
            worst = max(peaks.values()) / single_peak[0]
    act = {m: statistics.median(r["activation_peak_bytes"] for r in steady(rows)) for m, rows in runs.items()}
    tps = {m: statistics.median(r["tokens_per_s"] for r in steady(rows)) for m, rows in runs.items()}
    print(f"activation_peak_mb_none={act['none'] / 2**20:.1f} activation_peak_mb_full={act['full'] / 2**20:.1f} "
          f"(rank 0)")
    print(f"tokens_per_s_none={tps['none']:.1f} tokens_per_s_full={tps['full']:.1f}")
    print(f"max_rank_peak_rss_fraction={worst:.3f}")
    print(f"recompute_activation_bytes_ratio={act['full'] / act['none']:.3f}")
    print(f"recompute_step_time_ratio={tps['none'] / tps['full']:.3f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
