#!/usr/bin/env bash
# A checkpoint file loads in Python with a few lines of ordinary code (the
# lines the README shows), with Debian's python3 and numpy.
set -euo pipefail
fixture="$1"
path="${TEST_TMPDIR:-/tmp}/interop.safetensors"
"$fixture" "$path"
/usr/bin/python3 - "$path" <<'PY'
import json, struct, sys
import numpy as np

def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
              "I64": np.int64, "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}
    return {name: np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]],
                                dtype=dtypes[e["dtype"]]).reshape(e["shape"])
            for name, e in header.items() if name != "__metadata__"}, header["__metadata__"]

state, meta = load_safetensors(sys.argv[1])
assert sorted(state) == ["blocks.0.fc.weight", "ln_f.bias", "step"], sorted(state)
assert np.array_equal(state["blocks.0.fc.weight"], np.arange(12, dtype=np.float32).reshape(3, 4) / 4)
assert np.array_equal(state["ln_f.bias"], np.array([1.5, -2.5]))
assert np.array_equal(state["step"], np.array([7, 8, 9]))
assert meta["global_step"] == "7"
print("python interop: 3 tensors and metadata read back equal")
PY
