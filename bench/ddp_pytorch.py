#!/usr/bin/python3
"""PyTorch DistributedDataParallel baseline for `make bench-ddp`.

Trains the same nanoGPT-style decoder as the C++ trainer (op for op) on random
tokens over gloo, and prints one line on stdout:
    pytorch_ddp tokens_per_s=<float> step_time_s=<float> params=<int>
With --bf16 the forward pass runs under CPU bf16 autocast (torch.autocast("cpu",
dtype=torch.bfloat16)): fp32 weights, gradients and all-reduce, bf16 matmuls;
PyTorch's own recipe for mixed precision on CPU.
Run with /usr/bin/python3 (Debian's PyTorch 1.13).
"""
import os

# Must be set before torch is imported; spawned children re-import this module,
# so they inherit it too. One intra-op thread per rank keeps ranks from
# oversubscribing the cores, matching the C++ side.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse
import datetime
import math
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, context, p):
        super().__init__()
        self.h = heads
        self.c_attn = nn.Linear(d, 3 * d, bias=True)
        self.c_proj = nn.Linear(d, d, bias=True)
        self.attn_dropout = nn.Dropout(p)
        self.resid_dropout = nn.Dropout(p)
        # Plain attribute, not a registered buffer: DDP would otherwise
        # broadcast it every forward, a cost the C++ trainer does not pay.
        self.mask = torch.tril(torch.ones(context, context, dtype=torch.bool))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        # Manual attention on purpose: libtorch 1.13 on the C++ side has no
        # scaled_dot_product_attention, so both sides must do the same math.
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.h)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, d, p):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()  # exact erf form, not the tanh approximation
        self.c_proj = nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(p)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, d, heads, context, p):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, context, p)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d, p)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, context, d, layers, heads, p):
        super().__init__()
        assert d % heads == 0, "--width must be divisible by --heads"
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.drop = nn.Dropout(p)
        self.h = nn.ModuleList(Block(d, heads, context, p) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)  # deliberately untied from wte
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        # GPT-2 scaling: residual-stream projections shrink with depth.
        for b in self.h:
            for w in (b.attn.c_proj.weight, b.mlp.c_proj.weight):
                nn.init.normal_(w, 0.0, 0.02 / math.sqrt(2 * layers))

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def expected_params(V, T, d, L):
    return V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d + d * V


def worker(rank, a):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank,
                            world_size=a.nproc, timeout=datetime.timedelta(seconds=a.timeout))
    torch.manual_seed(1337)  # DDP broadcasts rank 0's weights anyway
    model = GPT(a.vocab, a.context, a.width, a.layers, a.heads, a.dropout)
    params = sum(p.numel() for p in model.parameters())
    want = expected_params(a.vocab, a.context, a.width, a.layers)
    assert params == want, f"param count {params} != formula {want}"
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, betas=(0.9, 0.95),
                            weight_decay=0.1, eps=1e-8)
    # Pre-draw every batch so token generation stays out of the timed region;
    # per-rank seeds give each rank different data, as in real DDP.
    g = torch.Generator().manual_seed(1234 + rank)
    data = torch.randint(0, a.vocab, (a.warmup + a.steps, a.batch, a.context + 1), generator=g)
    xs, ys = data[..., :-1].contiguous(), data[..., 1:].contiguous()

    def step(i):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = ddp(xs[i], ys[i])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        return loss

    for i in range(a.warmup):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(a.warmup, a.warmup + a.steps):
        loss = step(i)
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    # The slowest rank bounds throughput, so report against the max.
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if rank == 0:
        sec = elapsed.item()
        tps = a.nproc * a.batch * a.context * a.steps / sec
        print(f"rank0 final loss {loss.item():.4f}", file=sys.stderr)
        print(f"pytorch_ddp tokens_per_s={tps:.1f} step_time_s={sec / a.steps:.6f} "
              f"params={params} precision={'bf16-autocast' if a.bf16 else 'fp32'}", flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps")
    ap.add_argument("--bf16", action="store_true", help="forward under CPU bf16 autocast")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=600, help="whole-run limit, seconds")
    a = ap.parse_args()
    if a.steps < 1 or a.nproc < 1:
        ap.error("--steps and --nproc must be >= 1")
    a.port = a.port or free_port()

    # mp.Process rather than mp.spawn so every wait is bounded and a failed
    # rank can't leave its peers blocked in a collective forever.
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, a)) for r in range(a.nproc)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + a.timeout
    ok = True
    while any(p.is_alive() for p in procs):
        if any(p.exitcode not in (None, 0) for p in procs) or time.monotonic() > deadline:
            ok = False
            break
        time.sleep(0.1)
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(timeout=10)
    ok = ok and all(p.exitcode == 0 for p in procs)
    if not ok:
        codes = [p.exitcode for p in procs]
        print(f"ddp_pytorch: failed or timed out (exit codes {codes})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
