"""The PyTorch side of the interop tests (the venv's PyTorch 2.11):

  pytorch_reference.py logits CKPT_DIR LOGITS.safetensors SIZES_JSON
      loads an fsdp2 full checkpoint into torch_gpt.GPT with load_state_dict
      and checks its logits on the tokens in LOGITS against fsdp2's (1e-5).
  pytorch_reference.py train OUT_DIR SIZES_JSON STEPS
      builds torch_gpt.GPT, saves its state_dict() as OUT_DIR/state.safetensors
      (plain Python and numpy), then trains STEPS AdamW steps on fixed
      batches: OUT_DIR/batches.npz and OUT_DIR/losses.json.
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load_safetensors import load_safetensors, save_safetensors  # noqa: E402
from torch_gpt import GPT  # noqa: E402

# fsdp2's GPT2AdamW hyper-parameters but for lr (given).
ADAMW = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def check_logits(ckpt, logits_file, sizes):
    tensors, _ = load_safetensors(os.path.join(ckpt, "checkpoint.safetensors"))
    model = GPT(**sizes)
    # docs/checkpoints.md's lines: every entry but the optimizer's is the state dict.
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()
                           if not k.startswith("optim/")})
    model.eval()
    want, _ = load_safetensors(logits_file)
    with torch.no_grad():
        got = model(torch.from_numpy(want["tokens"].copy())).numpy()
    diff = float(np.abs(got - want["logits"]).max())
    assert got.shape == want["logits"].shape, (got.shape, want["logits"].shape)
    assert diff <= 1e-5, "PyTorch's logits differ from fsdp2's by %g" % diff
    print("pytorch: the fsdp2 checkpoint loads with load_state_dict; logits %s "
          "equal fsdp2's (max |diff| %.1e)" % (list(got.shape), diff))


def train(out, sizes, steps, lr=0.01, rows=8):
    torch.manual_seed(0)
    model = GPT(**sizes)
    save_safetensors(os.path.join(out, "state.safetensors"), model.state_dict())
    rng = np.random.default_rng(7)
    batches = {}
    for i in range(steps):
        seq = rng.integers(0, sizes["vocab_size"], size=(rows, sizes["block_size"] + 1))
        batches["tokens%d" % i] = seq[:, :-1].astype(np.int64)
        batches["targets%d" % i] = seq[:, 1:].astype(np.int64)
    np.savez(os.path.join(out, "batches.npz"), **batches)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, **ADAMW)
    losses = []
    for i in range(steps):
        loss = model.loss(torch.from_numpy(batches["tokens%d" % i]),
                          torch.from_numpy(batches["targets%d" % i]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with open(os.path.join(out, "losses.json"), "w") as f:
        json.dump({"lr": lr, "adamw": ADAMW, "losses": losses}, f)


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "logits":
        check_logits(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
    elif sys.argv[1] == "train":
        train(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("usage: see the docstring")
