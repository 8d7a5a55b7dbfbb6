#!/usr/bin/env python3
"""Your own PyTorch model, trained with FSDP2: define it in plain PyTorch,
torch.jit.script and save it, then train the saved file with fsdp2 on local
ranks (each block of the nn.ModuleList becomes an FSDP unit):

    bazel run //examples:train_torchscript_py -- --nproc 2 --steps 20

Two steps, in separate processes, so that the training ranks never load
Python's torch (fsdp2 brings its own LibTorch; with another torch version
in the same process the two would clash):
  1. export: this file runs itself with --export PATH under the same
     Python (which needs `import torch`: the project's environment has
     PyTorch 2.11, whose torch.jit.script still works but warns that it is
     deprecated); only that process imports torch. It writes the
     TorchScript file.
  2. train: fsdp2.launch_local runs this file again as --nproc ranks, which
     import fsdp2 (never torch), load the file with
     fsdp2.Model.from_torchscript and train it on their rows of each global
     batch: a character-level transformer on a text file's bytes.
Under torchrun, srun or mpirun, export once (--export model.pt) and start
the ranks with --model model.pt. --model also trains a file you scripted
yourself (forward(tokens [B, T]) returning logits [B, T, 256]).
"""

import argparse
import os
import subprocess
import sys
import tempfile

VOCAB = 256  # bytes


def export(path, args):
    """Step 1 (a process of its own): the model in plain PyTorch, scripted."""
    import math

    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d: int, heads: int):
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            B, T, C = x.shape
            qkv = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
            causal = torch.ones(T, T, dtype=torch.bool).triu(1)
            att = att.masked_fill(causal, float("-inf")).softmax(dim=-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
            return x + self.mlp(self.ln2(x))

    class CharTransformer(nn.Module):
        def __init__(self, block_size: int, n_layer: int, d: int, heads: int):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, d)
            self.pos = nn.Embedding(block_size, d)
            self.blocks = nn.ModuleList([Block(d, heads) for _ in range(n_layer)])
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, VOCAB)

        def forward(self, tokens):
            x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    torch.manual_seed(args.seed)
    model = CharTransformer(args.block_size, args.n_layer, args.n_embd, args.n_head)
    torch.jit.save(torch.jit.script(model), path)
    print(f"export: {type(model).__name__} of {sum(p.numel() for p in model.parameters())} "
          f"parameters scripted to {path}", flush=True)


def global_batch(text, step, rows, block_size):
    """Windows of block_size + 1 bytes at offsets every rank draws alike."""
    import numpy as np
    rng = np.random.default_rng(step)
    starts = rng.integers(0, len(text) - block_size - 1, size=rows)
    seq = np.stack([text[s:s + block_size + 1] for s in starts]).astype(np.int64)
    return seq[:, :-1], seq[:, 1:]


def train(args):
    """Step 2 (each rank): fsdp2 trains the saved file; no torch here."""
    import numpy as np

    import fsdp2
    text = np.frombuffer(open(args.data, "rb").read(), dtype=np.uint8)
    with fsdp2.FSDP2Strategy(precision=args.precision, seed=args.seed) as strategy:
        strategy.setup_environment()
        # Every child of every nn.ModuleList becomes an FSDP unit (the
        # default); auto_wrap=["Block"] names them by class instead.
        with fsdp2.Model.from_torchscript(args.model, loss="cross_entropy") as model:
            strategy.connect(model, fsdp2.Optimizer(lr=args.lr, weight_decay=0.1))
            params = model.num_parameters()[1]
        strategy.parallelize()
        rank0 = strategy.rank == 0
        world, rank = strategy.data_parallel_size, strategy.data_parallel_rank
        rows = args.batch_size  # per rank
        if rank0:
            print(f"train_torchscript.py: {args.model}: {params} parameters, "
                  f"{world} ranks x {rows} rows of {args.block_size} bytes", flush=True)
        for step in range(args.steps):
            tokens, targets = global_batch(text, step, rows * world, args.block_size)
            mine = slice(rank * rows, (rank + 1) * rows)
            result = strategy.training_step([tokens[mine], targets[mine]], step,
                                            gradient_clip_val=1.0)
            if rank0:
                print(f"step {result.step} loss {result.loss:.4f} "
                      f"grad_norm {result.grad_norm:.3f}", flush=True)
        stats = strategy.memory_stats()
        mib = {k: v / 2**20 for k, v in stats.items()}
        print(f"rank {strategy.rank}: memory_stats: "
              f"sharded params {mib['sharded_param_bytes']:.3f} MiB of "
              f"{mib['total_param_bytes']:.3f} MiB, "
              f"optimizer state {mib['optimizer_state_bytes']:.3f} MiB, "
              f"peak unsharded params {mib['peak_unsharded_param_bytes']:.3f} MiB, "
              f"peak RSS {mib['peak_rss_bytes']:.0f} MiB", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8, help="rows per rank")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--data", default="/usr/share/common-licenses/GPL-3")
    parser.add_argument("--model", help="the TorchScript file to train (default: export the "
                        "model above to a temporary directory first)")
    parser.add_argument("--export", metavar="PATH", help="only script the model above and save "
                        "it to PATH (needs torch)")
    args = parser.parse_args()

    if args.export:  # step 1, in a process of its own
        export(args.export, args)
        return 0
    import fsdp2  # from here on: never torch
    if fsdp2.is_rank_process():  # step 2: one rank (launch_local, torchrun, srun, mpirun)
        if args.model is None:
            sys.exit("train_torchscript.py: under a launcher, export first (--export PATH) "
                     "and pass --model PATH")
        fsdp2.restart_with_rank_environment()  # as launch_local's ranks run
        train(args)
        return 0
    # Started by hand: export (unless given a file), then run the ranks.
    if args.model is None:
        args.model = os.path.join(tempfile.mkdtemp(prefix="fsdp2_script_"), "model.pt")
        subprocess.run([sys.executable, __file__, "--export", args.model] + sys.argv[1:],
                       check=True)
    return fsdp2.launch_local(args.nproc, argv=[__file__] + sys.argv[1:] + ["--model", args.model])


if __name__ == "__main__":
    sys.exit(main())
