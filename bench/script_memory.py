#!/usr/bin/env python3
"""Memory of a TorchScript model trained block by block from Python: the
field case of issue #13, a scripted residual model of 16 wide blocks in an
nn.ModuleList (width 1024: 134M parameters), trained with the fsdp2 Python
package on --nproc ranks (default 2), fp32, AdamW, --rows rows of width
1024 per rank. Side by side in one run:

  FULL_SHARD   the default wrapping: every block its own unit
  FULL_SHARD   "auto_wrap": [], the whole script one unit (fsdp2 before)
  NO_SHARD     replicated, gradients all-reduced (DDP's memory)

For each, the largest value over the ranks of: peak RSS over the training
steps (VmHWM, reset once the model is sharded and the optimizer built),
peak RSS of the whole process (the model's load included), the engine's
peak of unsharded parameter bytes, and the median step time. Then the
ratios the issue sets targets for: FULL_SHARD / NO_SHARD peak RSS (at most
0.65 at N = 2) and peak unsharded bytes in blocks (at most 2).

    bazel run -c opt //bench:script_memory
    bazel run -c opt //bench:script_memory -- --blocks 4 --width 256   # quick

Scripting needs PyTorch (the venv's, scripts/setup.sh), run in a process
of its own (tests/script/script_models.py wide).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import fsdp2

MIB = 1024.0 * 1024.0
CONFIGS = [
    ("FULL_SHARD, per block", "full_shard", None),
    ("FULL_SHARD, one unit", "full_shard", []),
    ("NO_SHARD", "no_shard", None),
]


def rank_main(args):
    import numpy as np

    config = json.loads(args.rank_config)
    with fsdp2.FSDP2Strategy(precision="fp32", sharding_strategy=config["strategy"],
                             seed=1) as strategy:
        strategy.setup_environment()
        with fsdp2.Model.from_torchscript(config["model"], loss="mse",
                                          auto_wrap=config["auto_wrap"]) as model:
            strategy.connect(model, fsdp2.Optimizer(lr=1e-4, weight_decay=0.0))
        strategy.parallelize()
        process_peak = strategy.memory_stats()["peak_rss_bytes"]
        strategy.reset_peak_memory_stats()
        rng = np.random.default_rng(strategy.rank)
        times = []
        for step in range(args.steps):
            x = rng.standard_normal((args.rows, args.width), dtype=np.float32)
            y = rng.standard_normal((args.rows, args.width), dtype=np.float32)
            start = time.perf_counter()
            strategy.training_step([x, y], step)
            times.append(time.perf_counter() - start)
        stats = strategy.memory_stats()
        stats["process_peak_rss_bytes"] = max(process_peak, stats["peak_rss_bytes"])
        stats["step_s"] = statistics.median(times[1:] if len(times) > 1 else times)
        with open(os.path.join(config["out"], f"rank{strategy.rank}.json"), "w") as f:
            json.dump(stats, f)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=8, help="rows per rank")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rank-config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_config:
        return rank_main(args)

    work = tempfile.mkdtemp(prefix="script_memory_")
    model = os.path.join(work, "wide.pt")
    maker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "script",
                         "script_models.py")
    subprocess.run([sys.executable, maker, "wide", model, str(args.blocks),
                    str(args.width)], check=True)
    # One block: LayerNorm (2w), up (4w*w + 4w), down (4w*w + w), fp32.
    w = args.width
    block_bytes = 4 * (2 * w + 4 * w * w + 4 * w + 4 * w * w + w)
    params = args.blocks * block_bytes // 4 + w * w + w
    print(f"script_memory: {args.blocks} blocks of width {w} ({params / 1e6:.0f}M parameters), "
          f"{args.nproc} ranks x {args.rows} rows, fp32, AdamW, allocator {fsdp2.allocator()}",
          flush=True)
    results = {}
    for name, strategy, auto_wrap in CONFIGS:
        out = os.path.join(work, strategy + ("_one" if auto_wrap == [] else ""))
        os.makedirs(out)
        config = json.dumps({"strategy": strategy, "auto_wrap": auto_wrap, "model": model,
                             "out": out})
        argv = [os.path.abspath(__file__)] + [a for a in sys.argv[1:]] + ["--rank-config",
                                                                          config]
        if fsdp2.launch_local(args.nproc, argv=argv, threads_per_rank=1) != 0:
            sys.exit(f"script_memory: the {name} run failed")
        ranks = []
        for r in range(args.nproc):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
        results[name] = {k: max(s[k] for s in ranks) for k in
                         ("peak_rss_bytes", "process_peak_rss_bytes",
                          "peak_unsharded_param_bytes", "step_s")}

    print(f"{'configuration':<24} {'peak RSS train':>15} {'peak RSS process':>17} "
          f"{'peak unsharded':>15} {'step':>8}")
    for name, r in results.items():
        print(f"{name:<24} {r['peak_rss_bytes'] / MIB:>11.0f} MiB "
              f"{r['process_peak_rss_bytes'] / MIB:>13.0f} MiB "
              f"{r['peak_unsharded_param_bytes'] / MIB:>11.0f} MiB {r['step_s']:>7.2f}s")
    fs, one, ns = (results[n] for n, _, _ in CONFIGS)
    print(f"FULL_SHARD per block / NO_SHARD, peak RSS train:   "
          f"{fs['peak_rss_bytes'] / ns['peak_rss_bytes']:.2f} (target <= 0.65 at N = 2)")
    print(f"FULL_SHARD per block / NO_SHARD, peak RSS process: "
          f"{fs['process_peak_rss_bytes'] / ns['process_peak_rss_bytes']:.2f}")
    print(f"FULL_SHARD one unit / NO_SHARD, peak RSS train:    "
          f"{one['peak_rss_bytes'] / ns['peak_rss_bytes']:.2f}")
    # The root unit (the output layer) stays gathered through the step, as
    # PyTorch's FSDP2 keeps its root; the blocks come and go.
    root_bytes = 4 * (w * w + w)
    print(f"peak unsharded parameters, per block: "
          f"{(fs['peak_unsharded_param_bytes'] - root_bytes) / block_bytes:.2f} blocks "
          f"(target <= 2) + the root's {root_bytes / MIB:.0f} MiB; one unit: "
          f"{one['peak_unsharded_param_bytes'] / block_bytes:.2f} blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
