"""Reads and writes safetensors files (fsdp2 checkpoints, PyTorch state
dicts) with json, struct and numpy: no safetensors package needed.

These are the lines docs/checkpoints.md shows; //core/checkpoint:python_interop_test
and //tests:strategy_test run them.
"""
import json
import struct

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
            for name, e in header.items() if name != "__metadata__"}, header.get("__metadata__", {})


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: numpy array (or torch tensor)} as a safetensors file."""
    codes = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32",
             np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
             np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        if hasattr(value, "detach"):  # a torch tensor
            value = value.detach().cpu().numpy()
        a = np.ascontiguousarray(value)
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": codes[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


if __name__ == "__main__":
    # load_safetensors.py FULL_CHECKPOINT STATE: the checkpoint's model
    # entries (all but optim/...) must be exactly STATE's keys and values.
    import sys
    full, _ = load_safetensors(sys.argv[1])
    state, _ = load_safetensors(sys.argv[2])
    model = {k: v for k, v in full.items() if not k.startswith("optim/")}
    assert sorted(model) == sorted(state), (sorted(model), sorted(state))
    for k in state:
        assert np.array_equal(model[k], state[k]), k
    print("python: the full checkpoint holds the model state, %d tensors equal" % len(state))
