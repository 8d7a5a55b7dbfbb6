"""Models written in plain PyTorch, scripted with torch.jit.script and saved,
and PyTorch's own training of them: the reference that fsdp2 must match when
it trains the saved files (//tests:script_units_test, the Python binding
tests, bench/script_memory.sh). Run with the project environment's python3
(PyTorch 2.11, scripts/setup.sh), in a process of its own.

  script_models.py make MODEL OUT_DIR [STEPS]
      writes OUT_DIR/model.pt (torch.jit.save), OUT_DIR/batches.safetensors
      ("s{step}.{i}": the global batch of each step, the loss's target last
      unless the model computes its own loss) and OUT_DIR/reference.json
      (the model's loss and input count, and PyTorch's losses for STEPS
      AdamW steps on those batches).
  script_models.py wide OUT_PATH N_BLOCKS WIDTH
      writes only the scripted wide residual model (the memory benchmark's).

Models (sizes small: the tests run N ranks on 2 cores):
  gpt        tokens -> logits; cross_entropy against next tokens. Blocks in
             an nn.ModuleList, a tied LM head.
  masked     forward(x, mask): two inputs; mse.
  self_loss  forward(x, y) returns the scalar loss itself ("loss": "model").
  moe        forward(x, route): each layer sends row b to expert route[b];
             experts sit in an nn.ModuleList inside each layer, and an expert
             that gets no rows is not called. Rows 0-5 use experts 0-2, rows
             6-11 experts 0, 1, 3, so with 2 or more ranks some rank never
             calls expert 2 or 3; at step 2 no row goes to expert 3 at all.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "core", "checkpoint"))
from load_safetensors import save_safetensors  # noqa: E402

ROWS = 12  # divisible by 1, 2, 3 and 4 ranks
ADAMW = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.heads
        qkv = self.qkv(x).view(B, T, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = att.masked_fill(causal, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=64, block=16, layers=3, d=32, heads=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        nn.init.normal_(self.wte.weight, std=0.02)

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class Residual(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)

    def forward(self, x):
        return self.down(torch.tanh(self.up(self.ln(x))))


class Masked(nn.Module):
    def __init__(self, d_in=6, d=16, out=3, layers=3):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList([Residual(d, 2 * d) for _ in range(layers)])
        self.out = nn.Linear(d, out)

    def forward(self, x, mask):
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h) * mask.unsqueeze(1)
        return self.out(h)


class SelfLoss(nn.Module):
    def __init__(self, d_in=6, d=16, out=3, layers=2):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList([Residual(d, 2 * d) for _ in range(layers)])
        self.out = nn.Linear(d, out)

    def forward(self, x, y):
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return F.mse_loss(self.out(h), y)


class MoELayer(nn.Module):
    def __init__(self, d: int, experts: int):
        super().__init__()
        self.gate = nn.Linear(d, experts)
        self.experts = nn.ModuleList([Residual(d, 2 * d) for _ in range(experts)])

    def forward(self, x, route):
        weight = torch.softmax(self.gate(x), dim=-1)
        out = x
        for i, expert in enumerate(self.experts):
            rows = torch.nonzero(route == i).flatten()
            if rows.numel() > 0:
                y = expert(x.index_select(0, rows)) * weight.index_select(0, rows)[:, i:i + 1]
                out = out.index_add(0, rows, y)
        return out


class MoE(nn.Module):
    def __init__(self, d_in=6, d=16, out=3, layers=2, experts=4):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.layers = nn.ModuleList([MoELayer(d, experts) for _ in range(layers)])
        self.out = nn.Linear(d, out)

    def forward(self, x, route):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h, route)
        return self.out(h)


class Wide(nn.Module):
    """The memory benchmark's model: wide residual blocks in a ModuleList."""

    def __init__(self, blocks: int, width: int):
        super().__init__()
        self.blocks = nn.ModuleList([Residual(width, 4 * width) for _ in range(blocks)])
        self.out = nn.Linear(width, width)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.out(x)


def batches(name, steps):
    g = torch.Generator().manual_seed(7)
    out = []
    for step in range(steps):
        if name == "gpt":
            seq = torch.randint(0, 64, (ROWS, 17), generator=g)
            out.append([seq[:, :-1].contiguous(), seq[:, 1:].contiguous()])
            continue
        x = torch.randn(ROWS, 6, generator=g)
        y = torch.randn(ROWS, 3, generator=g)
        if name == "masked":
            mask = (torch.rand(ROWS, generator=g) > 0.3).float()
            out.append([x, mask, y])
        elif name == "self_loss":
            out.append([x, y])
        elif name == "moe":
            first = torch.tensor([0, 1, 2, 2, 1, 0])
            second = torch.tensor([3, 0, 1, 3, 3, 1])
            if step == 2:
                second = torch.tensor([0, 0, 1, 1, 0, 1])  # expert 3 idle everywhere
            out.append([x, torch.cat([first, second]), y])
    return out


MODELS = {"gpt": (GPT, "cross_entropy"), "masked": (Masked, "mse"),
          "self_loss": (SelfLoss, "model"), "moe": (MoE, "mse")}


def loss_of(model, loss, batch):
    if loss == "model":
        return model(*batch)
    out = model(*batch[:-1])
    if loss == "cross_entropy":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), batch[-1].reshape(-1))
    return F.mse_loss(out, batch[-1])


def make(name, out_dir, steps):
    torch.manual_seed(0)
    cls, loss = MODELS[name]
    model = torch.jit.script(cls())
    os.makedirs(out_dir, exist_ok=True)
    torch.jit.save(model, os.path.join(out_dir, "model.pt"))
    data = batches(name, steps)
    save_safetensors(os.path.join(out_dir, "batches.safetensors"),
                     {f"s{s}.{i}": t for s, b in enumerate(data) for i, t in enumerate(b)})
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for batch in data:
        # Gradients zeroed in place, as LibTorch's zero_grad() (and PyTorch
        # 1.13's default) does: a parameter that got no gradient this step
        # (expert 3 at step 2) still takes an AdamW step with a zero one.
        opt.zero_grad(set_to_none=False)
        value = loss_of(model, loss, batch)
        value.backward()
        opt.step()
        losses.append(value.item())
    inputs = len(data[0]) - (0 if loss == "model" else 1)
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump({"model": name, "loss": loss, "inputs": inputs, "steps": steps,
                   "tensors": len(data[0]), "adamw": ADAMW, "losses": losses}, f)


def main(argv):
    if len(argv) >= 3 and argv[0] == "make":
        make(argv[1], argv[2], int(argv[3]) if len(argv) > 3 else 4)
    elif len(argv) == 4 and argv[0] == "wide":
        torch.manual_seed(0)
        torch.jit.save(torch.jit.script(Wide(int(argv[2]), int(argv[3]))), argv[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
