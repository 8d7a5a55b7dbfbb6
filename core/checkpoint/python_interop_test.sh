#!/usr/bin/env bash
# A checkpoint file loads in Python with a few lines of ordinary code (the
# lines docs/checkpoints.md shows), with Debian's python3 and numpy.
set -euo pipefail
fixture="$1"
path="${TEST_TMPDIR:-/tmp}/interop.safetensors"
"$fixture" "$path"
reader="$2"
PYTHONPATH="$(dirname "$reader")" "$FSDP2_PYTHON" - "$path" <<'PY'
import sys
import numpy as np
from load_safetensors import load_safetensors

state, meta = load_safetensors(sys.argv[1])
assert sorted(state) == ["blocks.0.fc.weight", "ln_f.bias", "step"], sorted(state)
assert np.array_equal(state["blocks.0.fc.weight"], np.arange(12, dtype=np.float32).reshape(3, 4) / 4)
assert np.array_equal(state["ln_f.bias"], np.array([1.5, -2.5]))
assert np.array_equal(state["step"], np.array([7, 8, 9]))
assert meta["global_step"] == "7"
print("python interop: 3 tensors and metadata read back equal")
PY

# fsdp2 -> PyTorch: the main job trains the built-in GPT on 2 ranks and
# saves a full checkpoint; PyTorch's GPT (torch_gpt.py) loads it with
# load_state_dict and gives fsdp2's logits on the same tokens (1e-5).
train="$3"; logits="$4"; reference="$5"
tmp="${TEST_TMPDIR:-/tmp}"
sizes='{"vocab_size": 64, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32}'
timeout 300 "$train" --nproc 2 --steps 3 --data synthetic --vocab-size 64 --block-size 16 \
  --n-layer 2 --n-head 2 --n-embd 32 --batch-size 4 --threads 1 --val-every 0 \
  --checkpoint-format full --ckpt-dir "$tmp/gpt_ckpt" --out-dir "$tmp/gpt_out" > "$tmp/train.log" 2>&1 \
  || { cat "$tmp/train.log"; exit 1; }
"$logits" "$tmp/gpt_ckpt" 64 16 2 2 32 "$tmp/logits.safetensors"
"$FSDP2_PYTHON" "$reference" logits "$tmp/gpt_ckpt" "$tmp/logits.safetensors" "$sizes"
