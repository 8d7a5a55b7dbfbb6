#!/usr/bin/env python3
"""Supervised fine-tuning of a Hugging Face Llama, Mistral or Qwen2
checkpoint with FSDP2 from Python (the fsdp2 package): chat data in, a model
that transformers generates with out.

    bazel run //examples:finetune_hf_py -- --model /models/my-llama \\
        --data chats.jsonl --seq-len 1024 --pack --lora-rank 16 \\
        --save /models/my-llama-lora --save-merged /models/my-llama-merged \\
        --generate "What is FSDP?"

--model is a directory as transformers' save_pretrained writes it, with its
tokenizer. --data is one of:
  - JSON lines ({"messages": [...]} chats rendered with the tokenizer's chat
    template, {"prompt": ..., "completion": ...}, or {"text": ...}): prepared
    first by fsdp2.prepare_data into --prepared (prompts and template tokens
    are not learned; --pack puts several documents in a row, each attending
    only to itself);
  - a directory fsdp2.prepare_data wrote;
  - a flat file of token ids (no header, --token-dtype), every token learned.
The loss is the mean over every learned token of the global batch, across
ranks and micro-batches. --lora-rank trains LoRA adapters only (the base
weights stay frozen and sharded); --frozen trains part of the model instead.
--save writes what transformers loads (with LoRA: the adapters in PEFT's
layout, for PeftModel.from_pretrained), with the tokenizer and
generation_config.json; --save-merged the whole model with the adapters
merged in. --generate answers one question with transformers from the save.
Started by hand it runs itself again as --nproc local ranks; under torchrun,
srun or mpirun each process is one rank.
"""

import argparse
import os
import sys

import numpy as np

import fsdp2
from fsdp2 import prepare_data


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the Hugging Face checkpoint directory")
    parser.add_argument("--data", required=True,
                        help="JSON lines, a prepared dataset directory or a flat token file")
    parser.add_argument("--token-dtype", choices=["uint8", "uint16", "int32"], default="uint16")
    parser.add_argument("--prepared", help="where JSON lines are prepared (default: next to "
                                           "--data, <data>.prepared)")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per row of JSON lines")
    parser.add_argument("--pack", action="store_true",
                        help="pack several documents into each row of JSON lines")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="> 0: train LoRA adapters of this rank only")
    parser.add_argument("--lora-alpha", type=float, default=16.0)
    parser.add_argument("--lora-dropout", type=float, default=0.0)
    parser.add_argument("--lora-target-modules", default="q_proj,k_proj,v_proj,o_proj",
                        help="of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    parser.add_argument("--save", help="where to save the fine-tuned model (a new directory)")
    parser.add_argument("--save-merged", help="with --lora-rank: where to save the model with "
                                              "the adapters merged in")
    parser.add_argument("--generate", help="after saving, answer this with transformers")
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

    data = args.data
    jsonl = os.path.isfile(data) and data.endswith((".jsonl", ".json"))
    prepared = args.prepared or data + ".prepared"
    options = dict(precision=args.precision, seed=1337)
    if args.frozen:
        options["frozen_params"] = args.frozen
    with fsdp2.FSDP2Strategy(**options) as strategy:
        strategy.setup_environment()
        if jsonl:  # rank 0 prepares, the others wait for it
            if strategy.rank == 0:
                meta = prepare_data.prepare(args.model, data, prepared, args.seq_len,
                                            pack=args.pack, overwrite=True)
                print(f"finetune_hf.py: prepared {meta['rows']} rows of {meta['seq_len']} "
                      f"tokens from {meta['documents']} documents into {prepared}", flush=True)
            strategy.barrier()
            data = prepared
        with strategy.tensor_init_context():
            model = fsdp2.Model.from_hf(args.model, lora_rank=args.lora_rank,
                                        lora_alpha=args.lora_alpha,
                                        lora_dropout=args.lora_dropout,
                                        lora_target_modules=args.lora_target_modules)
        with model:
            strategy.connect(model, fsdp2.Optimizer(lr=args.lr, beta2=0.95, weight_decay=0.1))
            total = model.num_parameters()[1]
        strategy.parallelize()  # shards the model, then each rank reads its rows
        rank0 = strategy.rank == 0
        global_batch = args.batch_size * strategy.data_parallel_size
        dtype = getattr(np, args.token_dtype)
        with strategy.token_dataloader(data, args.block_size, global_batch, dtype,
                                       end_fraction=0.9) as train, \
             strategy.token_dataloader(data, args.block_size, global_batch, dtype,
                                       begin_fraction=0.9) as val:
            if rank0:
                print(f"finetune_hf.py: {args.model}: {total} parameters "
                      f"on {strategy.world_size} ranks, {len(train)} batches per epoch"
                      + (f", frozen {args.frozen}" if args.frozen else "")
                      + (f", LoRA rank {args.lora_rank} on {args.lora_target_modules}"
                         if args.lora_rank else ""), flush=True)
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
                print(f"saved {args.save}: " + ("PeftModel.from_pretrained(base, it) loads the "
                                                 "adapters" if args.lora_rank else
                                                 "AutoModelForCausalLM.from_pretrained() loads it"))
        if args.save_merged:
            strategy.save_hf(args.save_merged, max_shard_size=args.max_shard_size,
                             dtype=args.save_dtype, merged=True)
            if rank0:
                print(f"saved {args.save_merged}: the adapters merged in; "
                      "AutoModelForCausalLM.from_pretrained() loads it")
        if args.generate and rank0:
            generate(args)


def generate(args):
    """One answer to --generate, by transformers from what was saved."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.save_merged or (args.save and not args.lora_rank):
        where = args.save_merged or args.save
        model = AutoModelForCausalLM.from_pretrained(where)
    elif args.save:
        from peft import PeftModel  # the adapters over the base checkpoint

        where = args.save
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(args.model), where)
    else:
        raise SystemExit("finetune_hf.py: --generate needs --save or --save-merged")
    tok = AutoTokenizer.from_pretrained(where)
    messages = [{"role": "user", "content": args.generate}]
    if tok.chat_template:
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True,
                                         return_tensors="pt")
    else:
        prompt = tok(args.generate, return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=32, do_sample=False)
    answer = tok.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    print(f"generated by transformers from {where}: {answer!r}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except fsdp2.Error as e:
        print(f"finetune_hf.py: {e}", file=sys.stderr)
        sys.exit(1)
