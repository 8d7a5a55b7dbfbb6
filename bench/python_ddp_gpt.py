#!/usr/bin/env python3
"""PyTorch's own data-parallel training (DDP, or FSDP2's fully_shard, on
gloo, CPU) of the same GPT as core/models/gpt.cc, for the benchmarks'
comparison.

Each rank trains its slice of one global batch of random tokens with AdamW
and clipping at 1.0, like the C++ benchmark. Prints `torch_version V`,
`median_step_s S` (the slowest rank's time per step, median over steps) and
`peak_rss_mib M` (the largest peak resident set over the ranks). With
`--bf16 1` forward and loss run under CPU bf16 autocast (PyTorch's own mixed
precision: fp32 parameters, gradients and all-reduce). With `--no-comm 1`
the ranks skip DDP and train alone (no gradient exchange): the ceiling of
any data-parallel step that runs PyTorch's kernels on the same cores. With
`--fsdp2 1` PyTorch's own FSDP2 shards the model instead of DDP:
`fully_shard` on each block, then on the root (FULL_SHARD: reshard after
forward), on a 1-D CPU device mesh; `--bf16 1` is then its
MixedPrecisionPolicy (bf16 parameters and compute, fp32 reduction), as
fsdp2's own bf16 policy. `--prefetch D` (with `--fsdp2 1`) gives every block
explicit prefetch lists of the D blocks after it (forward) and before it
(backward), PyTorch's set_modules_to_forward_prefetch /
set_modules_to_backward_prefetch: the counterpart of fsdp2's prefetch
depth D (-1, the default, leaves PyTorch's own defaults).

    python3 bench/python_ddp_gpt.py --nproc 2 [--threads 1] [--bf16 1] [--no-comm 1 | --fsdp2 1]

Runs on the project's Python environment (scripts/setup.sh: PyTorch 2.11).
"""
import argparse
import math
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fc_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        heads = lambda t: t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        att = q @ k.transpose(-2, -1) / math.sqrt(C // self.n_head)
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = att.masked_fill(causal, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.fc_proj(F.gelu(self.fc(self.ln2(h))))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte = nn.Embedding(a.vocab_size, a.n_embd)
        self.wpe = nn.Embedding(a.block_size, a.n_embd)
        self.blocks = nn.ModuleList(Block(a.n_embd, a.n_head) for _ in range(a.n_layer))
        self.ln_f = nn.LayerNorm(a.n_embd)
        # core/models/gpt.cc's (GPT-2's) initialisation: N(0, 0.02) for the
        # embeddings and linear weights, zero biases, the residual
        # projections scaled by 1/sqrt(2 n_layer). With PyTorch's defaults
        # (an N(0, 1) embedding tied to the head) the first steps' logits
        # were so large that up to 30% of their softmax underflowed to
        # denormal floats, and the head's backward matmuls crawled (the 3.3M
        # model's second step took 675 ms instead of 287 on one core): a
        # different model, not a slower DDP.
        residual_std = 0.02 / math.sqrt(2 * a.n_layer)
        with torch.no_grad():
            for embedding in (self.wte, self.wpe):
                nn.init.normal_(embedding.weight, 0.0, 0.02)
            for block in self.blocks:
                for linear, std in ((block.qkv, 0.02), (block.proj, residual_std),
                                    (block.fc, 0.02), (block.fc_proj, residual_std)):
                    nn.init.normal_(linear.weight, 0.0, std)
                    nn.init.zeros_(linear.bias)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.size(1)))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def run(rank, a, port):
    torch.set_num_threads(a.threads or max(1, (os.cpu_count() or 1) // a.nproc))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=a.nproc)
    torch.manual_seed(1337)
    model = GPT(a)
    autocast = bool(a.bf16)
    if a.fsdp2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mesh = init_device_mesh("cpu", (a.nproc,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if a.bf16 else MixedPrecisionPolicy()
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        if a.prefetch >= 0:
            blocks = list(model.blocks)
            for i, block in enumerate(blocks):
                block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + a.prefetch])
                block.set_modules_to_backward_prefetch(
                    blocks[max(0, i - a.prefetch):i][::-1])
        ddp, autocast = model, False
    else:
        # --no-comm 1: no DDP, so no gradient exchange (the docstring says why).
        wrap = a.nproc > 1 and not a.no_comm
        ddp = nn.parallel.DistributedDataParallel(model) if wrap else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95),
                            weight_decay=0.1)
    gen = torch.Generator().manual_seed(7)
    b = a.global_batch // a.nproc
    batches = []
    for _ in range(4):
        g = torch.randint(a.vocab_size, (a.global_batch, a.block_size + 1), generator=gen)
        mine = g[rank * b:(rank + 1) * b]
        batches.append((mine[:, :-1].contiguous(), mine[:, 1:].contiguous()))
    times = []
    for step in range(a.warmup + a.steps):
        x, y = batches[step % len(batches)]
        start = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = ddp(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - start)
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0],
                        dtype=torch.float64)  # ru_maxrss is in KiB on Linux
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("torch_version", torch.__version__, flush=True)
        print("median_step_s", statistics.median(t.tolist()), flush=True)
        print("peak_rss_mib", peak.item(), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    for name, default in [("nproc", 2), ("steps", 20), ("warmup", 3), ("n-layer", 4),
                          ("n-embd", 128), ("n-head", 4), ("block-size", 64),
                          ("vocab-size", 256), ("global-batch", 16),
                          ("threads", 0), ("bf16", 0), ("no-comm", 0), ("fsdp2", 0),
                          ("prefetch", -1)]:
        p.add_argument("--" + name, type=int, default=default)
    a = p.parse_args()
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(a, port), nprocs=a.nproc, join=True)


if __name__ == "__main__":
    main()
