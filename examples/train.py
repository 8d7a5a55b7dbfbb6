#!/usr/bin/env python3
"""Trains the GPT-style model with FSDP2 from Python (the fsdp2 package):

    bazel run //examples:train_py -- --nproc 2 --steps 20 --ckpt-dir /tmp/ckpt_py

Started by hand it runs itself again as --nproc local ranks; under torchrun,
srun or mpirun each process is one rank. The text is a file's bytes
(default: the GPL-3 text every Debian machine ships), read natively by the
token-file loader, 90% for training and 10% for validation. At the end every
rank writes its shards of a checkpoint.
"""

import argparse
import sys

import fsdp2


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4, help="rows per rank")
    parser.add_argument("--data", default="/usr/share/common-licenses/GPL-3")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--ckpt-dir")
    args = parser.parse_args()

    if not fsdp2.is_rank_process():
        sys.exit(fsdp2.launch_local(args.nproc))
    # A rank of torchrun, srun or mpirun: restart once with the allocator and
    # the OpenBLAS core type that launch_local gives its ranks.
    fsdp2.restart_with_rank_environment()

    with fsdp2.FSDP2Strategy(precision=args.precision, seed=1337) as strategy:
        strategy.setup_environment()
        # Built after setup_environment, which seeds every rank alike.
        with fsdp2.Model.gpt(vocab_size=256, block_size=64, n_layer=2, n_head=4,
                             n_embd=64) as model:
            strategy.connect(model, fsdp2.Optimizer(lr=3e-3, beta2=0.95, weight_decay=0.1))
            params = model.num_parameters()[1]
        strategy.parallelize()
        rank0 = strategy.rank == 0
        print(f"train.py: rank {strategy.rank} of {strategy.world_size}, "
              f"allocator {fsdp2.allocator()}", flush=True)
        global_batch = args.batch_size * strategy.data_parallel_size
        with strategy.token_dataloader(args.data, 64, global_batch, end_fraction=0.9) as train, \
             strategy.token_dataloader(args.data, 64, global_batch, begin_fraction=0.9) as val:
            if rank0:
                print(f"train.py: {fsdp2.version()}; GPT of {params} parameters on "
                      f"{strategy.world_size} ranks, {len(train)} batches per epoch", flush=True)
            for i in range(args.steps):
                if i > 0 and i % len(train) == 0:
                    train.set_epoch(i // len(train))
                result = strategy.training_step_loader(train, i % len(train),
                                                       gradient_clip_val=1.0)
                if rank0:
                    print(f"step {result.step} loss {result.loss:.4f} "
                          f"grad_norm {result.grad_norm:.3f}", flush=True)
            val_loss = strategy.validation_step_loader(val, 0)
            if rank0:
                print(f"validation loss {val_loss:.4f}")
        if args.ckpt_dir:
            strategy.save_checkpoint(args.ckpt_dir)
            if rank0:
                print(f"checkpoint saved to {args.ckpt_dir}")


if __name__ == "__main__":
    try:
        main()
    except fsdp2.Error as e:
        print(f"train.py: {e}", file=sys.stderr)
        sys.exit(1)
