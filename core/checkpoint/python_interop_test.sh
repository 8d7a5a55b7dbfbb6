#!/usr/bin/env bash
# A checkpoint file loads in Python with a few lines of ordinary code (the
# lines the README shows), with Debian's python3 and numpy.
set -euo pipefail
fixture="$1"
path="${TEST_TMPDIR:-/tmp}/interop.safetensors"
"$fixture" "$path"
reader="$2"
PYTHONPATH="$(dirname "$reader")" /usr/bin/python3 - "$path" <<'PY'
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
