#!/usr/bin/env python3
"""PyTorch's side of the GPU check (bench/gpu_check/gpu_check.sh): fsdp2's
built-in GPT (core/checkpoint/torch_gpt.py, the same parameter names and
function) trained the way fsdp2's main job trains it, on the main job's
synthetic data, so that the two can be compared step for step.

    torch_reference.py init --out init.safetensors [sizes]
        writes a GPT-2-style initialisation (N(0, 0.02), residual projections
        scaled by 1/sqrt(2 n_layer), zero biases) that both sides start from
        (fsdp2: --init-from).
    torch_reference.py train --mode eager|fsdp2 --precision fp32|bf16 \
        --init init.safetensors [sizes] --steps K --warmup W --json out.json \
        [--compile] [--offload] [--clip C]
        trains K steps and writes {"losses", "median_step_s", "tokens_per_s",
        "peak_allocated_bytes", "torch", ...}.

Data and batches are examples/train_gpt.cc's with --data synthetic: the
token stream randint(vocab, 4096 (T + 1)) from a CPU generator seeded with
--seed, cut into windows of T + 1 tokens, the last 5% held out, global
batches drawn by core/strategy's DistributedSampler (a permutation from a
generator seeded with seed * 1000003 + epoch). The step is the main job's:
the mean cross-entropy of fp32 logits, clipping to 1.0, AdamW (betas 0.9,
0.95, eps 1e-8, weight decay 0.1), the loss read back every step.

--offload (with --mode fsdp2): PyTorch's CPU offload, fully_shard's
offload_policy=CPUOffloadPolicy(pin_memory=True) on every unit: shards,
gradients and AdamW's state in pinned host memory, AdamW (fused, its CPU
kernel) stepping on the host after the backward, with all the host's
threads unless OMP_NUM_THREADS says otherwise.

--compile: torch.compile(model), as a PyTorch user adds it in one line
(after fully_shard with --mode fsdp2); its first steps compile, so give
it --warmup.

--precision bf16: eager PyTorch under torch.autocast(bfloat16); FSDP2 with
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) on the blocks and
output_dtype=fp32 on the root, as fsdp2's default policy. --mode fsdp2 runs
fully_shard on each block and then the root on a one-rank NCCL mesh
(world size 1) where a GPU is, gloo on the CPU (the dry run).
"""
import argparse
import json
import math
import os
import statistics
import struct
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "core", "checkpoint"))
from torch_gpt import GPT  # noqa: E402
from load_safetensors import load_safetensors  # noqa: E402

DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float64: "F64"}


def save_safetensors(path, tensors):
    """A safetensors file of `tensors` (name -> contiguous CPU tensor)."""
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def add_size_args(p):
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-embd", type=int, default=768)
    p.add_argument("--n-head", type=int, default=12)
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--vocab-size", type=int, default=50304)
    p.add_argument("--seed", type=int, default=1337)


def build(a):
    return GPT(vocab_size=a.vocab_size, block_size=a.block_size, n_layer=a.n_layer,
               n_head=a.n_head, n_embd=a.n_embd)


def cmd_init(a):
    torch.manual_seed(a.seed)
    model = build(a)
    residual = 0.02 / math.sqrt(2 * a.n_layer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_f"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, residual if name.endswith(("attn.proj.weight", "fc_proj.weight"))
                          else 0.02)
    save_safetensors(a.out, dict(model.state_dict()))


def batches(a, steps, global_batch):
    """The main job's first `steps` global batches (epoch 0), on the CPU."""
    t1 = a.block_size + 1
    gen = torch.Generator().manual_seed(a.seed)
    tokens = torch.randint(a.vocab_size, (4096 * t1,), generator=gen, dtype=torch.long)
    rows = tokens.numel() // t1
    windows = tokens[:rows * t1].view(rows, t1)
    train = windows[:rows - max(rows // 20, 1)]
    order_gen = torch.Generator().manual_seed((a.seed * 1000003) % (1 << 64))
    order = torch.randperm(train.size(0), generator=order_gen)
    out = []
    for i in range(steps):
        idx = order[(i * global_batch + torch.arange(global_batch)) % train.size(0)]
        w = train.index_select(0, idx)
        out.append((w[:, :-1].contiguous(), w[:, 1:].contiguous()))
    return out


def cmd_train(a):
    device = torch.device("cuda" if torch.cuda.is_available() and a.device != "cpu" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(0)
    model = build(a)
    tensors, _ = load_safetensors(a.init)
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()})
    model.to(device)
    bf16 = a.precision == "bf16"
    autocast = bf16 and a.mode == "eager"
    if a.mode == "fsdp2":
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
        mesh = init_device_mesh(device.type, (1,))
        # fsdp2's policy: blocks pass bf16 between them, the root's output
        # (the logits) is cast to fp32.
        block_policy, root_policy = MixedPrecisionPolicy(), MixedPrecisionPolicy()
        if bf16:
            block_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                reduce_dtype=torch.float32)
            root_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32,
                                               output_dtype=torch.float32)
        # Pinned where there is a GPU (pinning needs its driver; the dry run
        # on the CPU pins nothing).
        offload = ({"offload_policy": CPUOffloadPolicy(pin_memory=device.type == "cuda")}
                   if a.offload else {})
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=block_policy, **offload)
        fully_shard(model, mesh=mesh, mp_policy=root_policy, **offload)
    if a.compile:
        # One line, as a PyTorch user adds it: Inductor compiles the model's
        # forward and backward (after fully_shard, as PyTorch's FSDP2 docs do).
        model = torch.compile(model)
    # AdamW's implementation: "fused" (one kernel, on a GPU) or "foreach"
    # (PyTorch's default on a GPU).
    # With offload the parameters are on the host: fused is AdamW's CPU kernel.
    impl = ({"fused": True} if a.adamw == "fused" and (device.type == "cuda" or a.offload)
            else {"foreach": True})
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, **impl)
    data = batches(a, a.warmup + a.steps, a.batch_size)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for step, (x, y) in enumerate(data):
        start = time.perf_counter()
        x, y = x.to(device), y.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # synchronises, as fsdp2's Trainer does
        times.append(time.perf_counter() - start)
    timed = times[a.warmup:] or times
    median = statistics.median(timed)
    result = {
        "mode": a.mode, "precision": a.precision, "device": str(device), "adamw": a.adamw,
        "offload": bool(a.offload), "compile": bool(a.compile), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "losses": losses, "median_step_s": median,
        "tokens_per_s": a.batch_size * a.block_size / median,
        "params": sum(p.numel() for p in model.parameters()),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else 0,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if device.type == "cuda" else 0,
    }
    with open(a.json, "w") as f:
        json.dump(result, f)
    if a.mode == "fsdp2":
        import torch.distributed as dist
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init")
    add_size_args(i)
    i.add_argument("--out", required=True)
    t = sub.add_parser("train")
    add_size_args(t)
    t.add_argument("--mode", choices=["eager", "fsdp2"], required=True)
    t.add_argument("--precision", choices=["fp32", "bf16"], required=True)
    t.add_argument("--init", required=True)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--warmup", type=int, default=0)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--device", default="auto")
    t.add_argument("--adamw", choices=["fused", "foreach"], default="fused")
    t.add_argument("--offload", action="store_true",
                   help="--mode fsdp2 with CPUOffloadPolicy(pin_memory=True)")
    t.add_argument("--clip", type=float, default=1.0, help="gradient clipping norm (0: off)")
    t.add_argument("--compile", action="store_true",
                   help="torch.compile(model) (Inductor), after fully_shard with --mode fsdp2")
    t.add_argument("--json", required=True)
    a = p.parse_args()
    (cmd_init if a.cmd == "init" else cmd_train)(a)


if __name__ == "__main__":
    main()
