"""transformers' and peft's side of //tests:sft_test (issue #46): supervised
fine-tuning on chat data, masked, packed, fully and with LoRA.

  fixture OUT   the tiny Llama with its tokenizer (OUT/base) and the chats
                (OUT/chat.jsonl) only, for the examples' tests
  make OUT PREPARE_DATA   a tiny random Llama with a word-level tokenizer and
                a chat template (OUT/base), chats in OUT/chat.jsonl,
                prepared by PREPARE_DATA (fsdp2.prepare_data as a script)
                packed (OUT/packed) and one chat a row (OUT/unpacked); PEFT's
                initial adapters under fsdp2's names (OUT/lora_init.
                safetensors); and transformers' and peft's fine-tunes on
                OUT/packed's global batches: OUT/ref_full.json and
                OUT/ref_lora.json (`losses`: per step), the models after
                them in OUT/ref_full and OUT/ref_lora (the adapters)
  check OUT --full DIR --adapter DIR --merged DIR   what fsdp2 saved: the
                full fine-tune loads in transformers, the adapters in peft
                over OUT/base, the merged model in transformers, each with
                the logits of the reference fine-tune; each save carries the
                tokenizer and generation_config.json and generates an answer

The reference computes each global batch's loss as transformers does with
num_items_in_batch: the cross-entropy summed over every learned target of
every document of the batch, over their number. It runs every packed
document alone (no packing, no padding), so equal losses also say that
fsdp2's packing (positions restarting, attention kept inside a document) is
the documents trained one by one.
"""
import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("TQDM_DISABLE", "1")
import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

SEQ, GLOBAL_ROWS, STEPS, LR = 32, 6, 3, 1e-2
LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
ROLES = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
WORDS = [f"w{i}" for i in range(80)]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|> "
    "{% generation %}{{ m['content'] }} <|end|>{% endgeneration %} "
    "{% else %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}")


def make_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + ROLES + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>",
                                   additional_special_tokens=ROLES)
    fast.chat_template = TEMPLATE
    fast.save_pretrained(path)
    return len(vocab)


def make_model(path, vocab):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # redrawn: init leaves norms at 1, which would hide misuse
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.dim() == 1 else 0.0))
    model.save_pretrained(path)


def make_chats(path, n=24):
    rng = np.random.default_rng(0)
    words = lambda lo, hi: " ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi))))
    with open(path, "w") as f:
        for i in range(n):
            messages = []
            if i % 3 == 0:
                messages.append({"role": "system", "content": words(1, 4)})
            for _ in range(1 + (i % 2)):
                messages.append({"role": "user", "content": words(1, 5)})
                messages.append({"role": "assistant", "content": words(1, 6)})
            f.write(json.dumps({"messages": messages}) + "\n")


def load_rows(path):
    meta = json.load(open(os.path.join(path, "meta.json")))
    shape = (meta["rows"], meta["seq_len"])
    read = lambda key: torch.from_numpy(
        np.fromfile(os.path.join(path, meta["files"][key]), dtype="<i4").reshape(shape)
        .astype(np.int64))
    return read("tokens"), read("labels"), read("segments")


def documents(tokens, labels, segments):
    """Each row's documents (tokens, shifted targets), padding left out."""
    docs = []
    for r in range(tokens.size(0)):
        seg = segments[r]
        for s in seg.unique(sorted=True).tolist():
            if s < 0:
                continue
            where = (seg == s).nonzero().flatten()
            docs.append((tokens[r, where], labels[r, where]))
    return docs


def batch_loss(model, docs):
    """Summed cross-entropy of every learned target over their number."""
    total, count = 0.0, 0
    for ids, targets in docs:
        logits = model(input_ids=ids[None]).logits[0].float()
        total = total + F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
        count += int((targets != -100).sum())
    return total / max(count, 1)


def fine_tune(model, trained, rows):
    tokens, labels, segments = rows
    opt = torch.optim.AdamW(trained, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    losses = []
    for step in range(STEPS):
        sl = slice(step * GLOBAL_ROWS, (step + 1) * GLOBAL_ROWS)
        loss = batch_loss(model, documents(tokens[sl], labels[sl], segments[sl]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def fixture(args):
    out = args.out
    os.makedirs(out, exist_ok=True)
    vocab = make_tokenizer(os.path.join(out, "base"))
    make_model(os.path.join(out, "base"), vocab)
    make_chats(os.path.join(out, "chat.jsonl"))


def make(args):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    out = args.out
    fixture(args)
    for name, extra in (("packed", ["--pack"]), ("unpacked", [])):
        subprocess.run([sys.executable, args.prepare_data, "--tokenizer", os.path.join(out, "base"),
                        "--input", os.path.join(out, "chat.jsonl"), "--output",
                        os.path.join(out, name), "--seq-len", str(SEQ)] + extra, check=True)
    rows = load_rows(os.path.join(out, "packed"))
    assert rows[0].size(0) >= STEPS * GLOBAL_ROWS, f"{rows[0].size(0)} packed rows"

    model = LlamaForCausalLM.from_pretrained(os.path.join(out, "base"))
    losses = fine_tune(model, list(model.parameters()), rows)
    model.save_pretrained(os.path.join(out, "ref_full"))
    json.dump({"losses": losses}, open(os.path.join(out, "ref_full.json"), "w"))

    torch.manual_seed(1)
    base = LlamaForCausalLM.from_pretrained(os.path.join(out, "base"))
    peft_model = get_peft_model(base, LoraConfig(lora_dropout=0.0, task_type="CAUSAL_LM", **LORA))
    with torch.no_grad():  # B starts at 0 in PEFT; drawn here so that it matters from step 1
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.05)
    init = {n.replace("base_model.model.", "").replace(".default", ""): p.detach().clone()
            for n, p in peft_model.named_parameters() if "lora_" in n}
    save_file(init, os.path.join(out, "lora_init.safetensors"))
    trained = [p for p in peft_model.parameters() if p.requires_grad]
    assert len(trained) == len(init), (len(trained), len(init))
    losses = fine_tune(peft_model, trained, rows)
    peft_model.save_pretrained(os.path.join(out, "ref_lora"))
    json.dump({"losses": losses}, open(os.path.join(out, "ref_lora.json"), "w"))
    print(f"made {out}: {rows[0].size(0)} packed rows; full losses "
          f"{json.load(open(os.path.join(out, 'ref_full.json')))['losses']}, lora {losses}")


def rel_diff(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def check(args):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    out = args.out
    tokens = load_rows(os.path.join(out, "unpacked"))[0][:4]
    base_dir = os.path.join(out, "base")
    results = {}
    with torch.no_grad():
        want_full = LlamaForCausalLM.from_pretrained(os.path.join(out, "ref_full"))(tokens).logits
        ref_lora = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base_dir),
                                             os.path.join(out, "ref_lora"))
        want_lora = ref_lora(tokens).logits
        got = {
            "full": AutoModelForCausalLM.from_pretrained(args.full)(tokens).logits,
            "adapter": PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base_dir),
                                                 args.adapter)(tokens).logits,
            "merged": AutoModelForCausalLM.from_pretrained(args.merged)(tokens).logits,
        }
    for name, logits in got.items():
        want = want_full if name == "full" else want_lora
        results[name] = rel_diff(logits, want)
        print(f"{name}: logits differ from the reference fine-tune's by {results[name]:.2e} "
              "(relative)")
    assert max(results.values()) <= args.tolerance, results
    # What the PEFT save holds: PEFT's names and config, nothing of the base.
    with open(os.path.join(args.adapter, "adapter_config.json")) as f:
        config = json.load(f)
    assert config["peft_type"] == "LORA" and config["r"] == LORA["r"], config
    assert sorted(config["target_modules"]) == sorted(LORA["target_modules"]), config
    for save in (args.full, args.adapter, args.merged):
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            assert os.path.isfile(os.path.join(save, name)), f"{save} lacks {name}"
    # The merged save generates an answer as it is: its own tokenizer, chat
    # template and generation config.
    tok = AutoTokenizer.from_pretrained(args.merged)
    model = AutoModelForCausalLM.from_pretrained(args.merged)
    prompt = tok.apply_chat_template([{"role": "user", "content": "w1 w2 w3"}],
                                     add_generation_prompt=True, return_dict=True,
                                     return_tensors="pt")
    answer = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert answer.size(1) > prompt["input_ids"].size(1), answer
    print("generated:", tok.decode(answer[0, prompt["input_ids"].size(1):]))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixture")
    fx.add_argument("out")
    m = sub.add_parser("make")
    m.add_argument("out")
    m.add_argument("prepare_data")
    c = sub.add_parser("check")
    c.add_argument("out")
    c.add_argument("--full", required=True)
    c.add_argument("--adapter", required=True)
    c.add_argument("--merged", required=True)
    c.add_argument("--tolerance", type=float, default=1e-5)
    args = p.parse_args()
    {"fixture": fixture, "make": make, "check": check}[args.cmd](args)


if __name__ == "__main__":
    main()
