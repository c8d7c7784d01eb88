#!/usr/bin/env python3
"""gpt-tiny against llama-tiny at (nearly) equal parameter count, on the same SentencePiece tokens.

Both recipes are trained for the same steps on the same layout, alternating (A B A B ...) so that noise from
other work on the machine falls on both; the figure is the ratio of their tokens per second in the same run.
Prints one line per run and `gpt_tok_s= llama_tok_s= llama_over_gpt=` (medians).
"""
import argparse
import re
import statistics
import subprocess
import sys
import tempfile


def run(binary, recipe, nproc, steps, extra):
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [binary, "train", recipe, "--nproc", str(nproc), "--set", f"train.steps={steps}",
               "--set", f'run.dir="{run_dir}"', "--set", "train.eval_every=0", "--set", "train.sample_tokens=0",
               "--set", "train.checkpoint_every=0", "--set", f"run.log_every={steps // 4}"] + extra
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        rates = [float(x) for x in re.findall(r"\| (\d+) tok/s", out.stdout)]
        params = re.search(r", (\d+) parameters", out.stdout)
        # The first logged window includes start-up; the rest are steady.
        return statistics.median(rates[1:] or rates), int(params.group(1)) if params else 0


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bin", default="build/crosstrain")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--set", action="append", default=[], help="extra --set for both recipes")
    a = p.parse_args()
    extra = [x for s in a.set for x in ("--set", s)]
    rates = {"gpt": [], "llama": []}
    for i in range(a.repeats):
        for family in ("gpt", "llama"):
            rate, params = run(a.bin, f"recipes/{family}-tiny-sp.toml", a.nproc, a.steps, extra)
            rates[family].append(rate)
            print(f"run {i + 1} {family}-tiny-sp: {params} parameters, {rate:.0f} tok/s", flush=True)
    g, l = statistics.median(rates["gpt"]), statistics.median(rates["llama"])
    print(f"gpt_tok_s={g:.0f} llama_tok_s={l:.0f} llama_over_gpt={l / g:.3f}")


if __name__ == "__main__":
    main()
