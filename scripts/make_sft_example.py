#!/usr/bin/env python3
"""Writes recipes/data/sft-example.jsonl: made-up prompt/response pairs for supervised fine-tuning.

Two-number additions and subtractions ("What is 12 + 7?\n" -> "19"), so what a model learned is checkable: the
loss on the response tokens falls, and a sample can be compared with the arithmetic. Deterministic (fixed seed).
Usage: scripts/make_sft_example.py [OUT] [COUNT]
"""
import json
import random
import sys


def examples(count, seed=17):
    rng = random.Random(seed)
    for _ in range(count):
        a, b = rng.randrange(50), rng.randrange(50)
        if rng.random() < 0.75:
            yield {"prompt": f"What is {a} + {b}?\n", "response": str(a + b)}
        else:
            a, b = max(a, b), min(a, b)
            yield {"prompt": f"What is {a} - {b}?\n", "response": str(a - b)}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "recipes/data/sft-example.jsonl"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    with open(out, "w", encoding="utf-8") as f:
        for e in examples(count):
            f.write(json.dumps(e) + "\n")


if __name__ == "__main__":
    main()
