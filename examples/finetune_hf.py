#!/usr/bin/env python3
"""Fine-tunes a Hugging Face Llama, Mistral or Qwen2 checkpoint with FSDP2
from Python (the fsdp2 package) and saves it back for transformers:

    bazel run //examples:finetune_hf_py -- --model /models/my-llama \\
        --data tokens.bin --token-dtype uint16 --save /models/my-llama-tuned

--model is a directory as transformers' save_pretrained writes it
(config.json, and model.safetensors or model-0000i-of-0000N.safetensors with
model.safetensors.index.json). --data is a flat file of token ids (no
header), e.g. from the model's own tokenizer:

    tok = AutoTokenizer.from_pretrained("/models/my-llama")
    ids = tok(open("corpus.txt").read())["input_ids"]
    numpy.array(ids, dtype=numpy.uint16 if len(tok) < 65536 else numpy.int32).tofile("tokens.bin")

Each rank loads only its rows of the weights (the model is built inside
tensor_init_context(), so no rank ever holds all of it); --frozen trains
only part of the model. --save writes what transformers'
AutoModelForCausalLM.from_pretrained(--save) loads, with no conversion
(copy the tokenizer files next to it yourself). Started by hand it runs
itself again as --nproc local ranks; under torchrun, srun or mpirun each
process is one rank.
"""

import argparse
import sys

import numpy as np

import fsdp2


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the Hugging Face checkpoint directory")
    parser.add_argument("--data", required=True, help="a flat file of token ids")
    parser.add_argument("--token-dtype", choices=["uint8", "uint16", "int32"], default="uint16")
    parser.add_argument("--save", help="where to save the fine-tuned model (a new directory)")
    parser.add_argument("--save-dtype", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--max-shard-size", default="5GB")
    parser.add_argument("--frozen", default="",
                        help="parameters not trained: names or globs, comma-separated, "
                             "e.g. 'model.embed_tokens.*,model.layers.0.*'")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4, help="rows per rank")
    parser.add_argument("--block-size", type=int, default=128, help="tokens per row")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    args = parser.parse_args()

    if not fsdp2.is_rank_process():
        sys.exit(fsdp2.launch_local(args.nproc))
    fsdp2.restart_with_rank_environment()

    options = dict(precision=args.precision, seed=1337)
    if args.frozen:
        options["frozen_params"] = args.frozen
    with fsdp2.FSDP2Strategy(**options) as strategy:
        strategy.setup_environment()
        with strategy.tensor_init_context():
            model = fsdp2.Model.from_hf(args.model)
        with model:
            strategy.connect(model, fsdp2.Optimizer(lr=args.lr, beta2=0.95, weight_decay=0.1))
            total = model.num_parameters()[1]
        strategy.parallelize()  # shards the model, then each rank reads its rows
        rank0 = strategy.rank == 0
        global_batch = args.batch_size * strategy.data_parallel_size
        dtype = getattr(np, args.token_dtype)
        with strategy.token_dataloader(args.data, args.block_size, global_batch, dtype,
                                       end_fraction=0.9) as train, \
             strategy.token_dataloader(args.data, args.block_size, global_batch, dtype,
                                       begin_fraction=0.9) as val:
            if rank0:
                print(f"finetune_hf.py: {args.model}: {total} parameters on "
                      f"{strategy.world_size} ranks, {len(train)} batches per epoch"
                      + (f", frozen {args.frozen}" if args.frozen else ""), flush=True)
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
                print(f"validation loss {val_loss:.4f}", flush=True)
        if args.save:
            strategy.save_hf(args.save, max_shard_size=args.max_shard_size, dtype=args.save_dtype)
            if rank0:
                print(f"saved {args.save}: AutoModelForCausalLM.from_pretrained() loads it")


if __name__ == "__main__":
    try:
        main()
    except fsdp2.Error as e:
        print(f"finetune_hf.py: {e}", file=sys.stderr)
        sys.exit(1)
