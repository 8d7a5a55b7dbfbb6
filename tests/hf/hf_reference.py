"""transformers' side of //tests:hf_llama_test (issue #27), in as few Python
processes as possible (importing transformers takes seconds):

  prepare OUT   tiny random checkpoints of each CASE in OUT/<case>, token
                batches in OUT/data.safetensors, and transformers' results
                in OUT/<case>.ref.safetensors (and OUT/<case>.frozen.ref...):
                `logits` of the `eval` tokens, `losses` of STEPS AdamW steps
                on the global batches, `after`: logits after them
  check DATA DIR...   for each directory fsdp2 saved: the layout
                save_pretrained's readers need, and its logits of DATA's
                eval tokens through from_pretrained in DIR.logits.safetensors
  tuned ORIGINAL SAVED ...   what examples/finetune_hf.py saved after
                fine-tuning ORIGINAL on a token file of one window repeated
                (so that every batch, whatever the sampler, is that window):
                the layout; frozen tensors bit for bit ORIGINAL's and every
                other one changed; transformers' own fine-tune of ORIGINAL
                (AdamW as the example's, clipping) gives the example's step
                losses and the logits of SAVED through from_pretrained; and
                SAVED's loss on the window is the validation loss the
                example printed from its model in memory

Cases: llama (Llama 3 rotary scaling, every bias, head_dim * heads !=
hidden_size, nine shards), mistral (one key/value head, sliding window 4 <
the sequence), qwen2 (tied embeddings, q/k/v biases), llama_bf16 and
llama_fp16 (the llama stored in bfloat16 / float16, one file). Every parameter is redrawn after
transformers' init, which leaves biases 0 and norms 1 and would hide their
misuse.
"""
import argparse
import fnmatch
import json
import os
import sys

os.environ.setdefault("TQDM_DISABLE", "1")
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

VOCAB, GLOBAL_BATCH, SEQ, STEPS = 96, 12, 16, 3


def config(family):
    import transformers as tf

    if family == "llama":
        return tf.LlamaConfig(
            vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=64, attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8})
    if family == "mistral":
        return tf.MistralConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=1, sliding_window=4,
            max_position_embeddings=64)
    if family == "qwen2":
        return tf.Qwen2Config(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
            max_position_embeddings=64)
    raise SystemExit(f"unknown family {family}")


CASES = {"llama": ("llama", None, "40KB"), "mistral": ("mistral", None, None),
         "qwen2": ("qwen2", None, None), "llama_bf16": ("llama", torch.bfloat16, None),
         "llama_fp16": ("llama", torch.float16, None)}
# Half of the layers, the embedding (with it Qwen2's tied head) and the norms.
FROZEN = "model.embed_tokens.*,model.layers.0.*,*norm*"
FROZEN_CASES = ("llama", "qwen2")


def make(path, family, dtype, max_shard_size):
    import transformers as tf

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config(family), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.05)
    if dtype is not None:
        model = model.to(dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)


def data(path):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(VOCAB, (STEPS + 1, GLOBAL_BATCH, SEQ + 1), generator=g)
    save_file({"inputs": tokens[:STEPS, :, :-1].contiguous(),
               "targets": tokens[:STEPS, :, 1:].contiguous(),
               "eval": tokens[STEPS, :4, :-1].contiguous()}, path)


def load(path):
    import transformers as tf

    return tf.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager")


def reference(path, data_path, out_path, frozen):
    model = load(path)
    d = load_file(data_path)
    with torch.no_grad():
        logits = model(input_ids=d["eval"]).logits
    globs = [g for g in frozen.split(",") if g]
    trained = []
    for name, p in model.named_parameters():
        if any(fnmatch.fnmatchcase(name, g) for g in globs):
            p.requires_grad_(False)
        else:
            trained.append(p)
    opt = torch.optim.AdamW(trained, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    losses = []
    for s in range(STEPS):
        out = model(input_ids=d["inputs"][s]).logits.float()
        loss = F.cross_entropy(out.reshape(-1, out.size(-1)), d["targets"][s].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        after = model(input_ids=d["eval"]).logits
    save_file({"logits": logits.contiguous(), "after": after.contiguous(),
               "losses": torch.tensor(losses, dtype=torch.float64)}, out_path)


def layout(path):
    # A save also writes generation_config.json (from config.json, or the
    # source's copy) and copies the source's tokenizer files, if any.
    assert os.path.isfile(os.path.join(path, "generation_config.json")), path
    companions = {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt",
                  "added_tokens.json", "chat_template.jinja", "chat_template.json"}
    names = sorted(n for n in os.listdir(path) if n not in companions)
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            j = json.load(f)
        files = sorted(set(j["weight_map"].values()))
        n = len(files)
        expected = [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
        assert files == expected, (files, expected)
        total = 0
        for fname in files:
            with safe_open(os.path.join(path, fname), "pt") as st:
                assert st.metadata().get("format") == "pt", (fname, st.metadata())
                for k in st.keys():
                    assert j["weight_map"][k] == fname, k
                    t = st.get_tensor(k)
                    total += t.numel() * t.element_size()
        assert j["metadata"]["total_size"] == total, (j["metadata"], total)
        assert names == sorted(files + ["config.json", "model.safetensors.index.json"]), names
    else:
        with safe_open(os.path.join(path, "model.safetensors"), "pt") as st:
            assert st.metadata().get("format") == "pt", st.metadata()
        assert names == ["config.json", "model.safetensors"], names
    print("layout ok:", path, names)


def prepare(args):
    os.makedirs(args.out, exist_ok=True)
    data_path = os.path.join(args.out, "data.safetensors")
    data(data_path)
    for case, (family, dtype, shard) in CASES.items():
        path = os.path.join(args.out, case)
        make(path, family, dtype, shard)
        reference(path, data_path, path + ".ref.safetensors", "")
        if case in FROZEN_CASES:
            reference(path, data_path, path + ".frozen.ref.safetensors", FROZEN)


def check(args):
    d = load_file(args.data)
    for path in args.dirs:
        layout(path)
        model = load(path)
        with torch.no_grad():
            save_file({"logits": model(input_ids=d["eval"]).logits.contiguous()},
                      path + ".logits.safetensors")


def tensors(path):
    """Every tensor of a checkpoint directory (one file or shards)."""
    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, name)))
    return out


def rel_diff(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def tuned(args):
    import numpy as np

    layout(args.saved)
    tokens = torch.from_numpy(np.fromfile(args.tokens, dtype=args.token_dtype).astype(np.int64))
    window = tokens[:args.block_size + 1]
    repeats = tokens.numel() // window.numel()
    assert repeats > 1 and torch.equal(tokens, window.repeat(repeats)), \
        "the token file must be one window repeated"
    globs = [g for g in args.frozen.split(",") if g]
    frozen = lambda name: any(fnmatch.fnmatchcase(name, g) for g in globs)

    # The tensors: frozen ones bit for bit the original's, the others trained.
    original, saved = tensors(args.original), tensors(args.saved)
    assert sorted(saved) == sorted(original), (sorted(saved), sorted(original))
    assert any(frozen(k) for k in original), f"no tensor matches {globs}"
    for k in sorted(original):
        a, b = original[k], saved[k]
        assert a.dtype == b.dtype and a.shape == b.shape, (k, a.dtype, b.dtype, a.shape, b.shape)
        same = torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))
        if frozen(k):
            assert same, f"{k} is frozen but was saved with other values"
        else:
            assert not same, f"{k} is trained but was saved with its original values"
    print(f"tensors ok: frozen ones unchanged bit for bit ({sum(map(frozen, original))}), "
          f"trained ones changed ({sum(not frozen(k) for k in original)})")

    # transformers fine-tunes ORIGINAL as the example does.
    inputs = window[:-1].repeat(args.rows, 1)
    targets = window[1:].repeat(args.rows, 1)
    model = load(args.original)
    trained = []
    for name, p in model.named_parameters():
        if frozen(name):
            p.requires_grad_(False)
        else:
            trained.append(p)
    opt = torch.optim.AdamW(trained, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    losses = []
    for _ in range(len(args.losses)):
        out = model(input_ids=inputs).logits.float()
        loss = F.cross_entropy(out.reshape(-1, out.size(-1)), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, args.clip)
        opt.step()
        losses.append(loss.item())
    worst = max(abs(a - b) for a, b in zip(losses, args.losses))
    print(f"losses: the example's {args.losses}, transformers' "
          f"{[round(l, 4) for l in losses]}; worst difference {worst:.1e}")
    assert worst <= 2e-4, "the example's losses are not transformers' fine-tune's"

    # SAVED through from_pretrained: the fine-tuned model's logits, and the
    # loss the example's model had in memory.
    eval_tokens = torch.cat([inputs[:1], load_file(args.data)["eval"]])
    with torch.no_grad():
        want = model(input_ids=eval_tokens).logits
        got = load(args.saved)(input_ids=eval_tokens).logits
    logits = rel_diff(got, want)
    out = got[:1].float()
    val = F.cross_entropy(out.reshape(-1, out.size(-1)), targets[0]).item()
    print(f"logits of the saved model: relative difference {logits:.1e} from transformers' "
          f"fine-tune; its loss {val:.6f}, the example's validation loss {args.val_loss}")
    assert logits <= args.logits_tolerance, "the saved model's logits differ"
    assert abs(val - args.val_loss) <= 1.5e-4, "the saved model is not the example's"


def main():
    os.environ.setdefault("TQDM_DISABLE", "1")
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare")
    pr.add_argument("out")
    pr.set_defaults(fn=prepare)
    c = sub.add_parser("check")
    c.add_argument("data")
    c.add_argument("dirs", nargs="+")
    c.set_defaults(fn=check)
    t = sub.add_parser("tuned")
    t.add_argument("original")
    t.add_argument("saved")
    t.add_argument("--data", required=True, help="prepare's data.safetensors (eval tokens)")
    t.add_argument("--tokens", required=True, help="the example's token file")
    t.add_argument("--token-dtype", default="uint16")
    t.add_argument("--block-size", type=int, required=True)
    t.add_argument("--rows", type=int, required=True, help="the global batch")
    t.add_argument("--frozen", default="")
    t.add_argument("--lr", type=float, required=True)
    t.add_argument("--clip", type=float, required=True)
    t.add_argument("--losses", type=float, nargs="+", required=True,
                   help="the example's step losses")
    t.add_argument("--val-loss", type=float, required=True,
                   help="the example's validation loss")
    t.add_argument("--logits-tolerance", type=float, default=1e-5)
    t.set_defaults(fn=tuned)
    args = p.parse_args()
    torch.set_num_threads(1)
    args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
