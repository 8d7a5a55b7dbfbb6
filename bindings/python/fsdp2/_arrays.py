"""numpy arrays in and out of the C ABI's fsdp2_tensor_t."""

import numpy as np

from . import fsdp2_c as _c

_DTYPES = {
    _c.FSDP2_DTYPE_FLOAT32: np.float32, _c.FSDP2_DTYPE_FLOAT64: np.float64,
    _c.FSDP2_DTYPE_FLOAT16: np.float16, _c.FSDP2_DTYPE_INT64: np.int64,
    _c.FSDP2_DTYPE_INT32: np.int32, _c.FSDP2_DTYPE_UINT8: np.uint8,
    _c.FSDP2_DTYPE_UINT16: np.uint16,
}


def _array(a):
    """A C-contiguous numpy array over `a` (no copy when it already is one)."""
    return np.ascontiguousarray(a)


def _batch(batch):
    if isinstance(batch, np.ndarray):
        batch = [batch]
    return [_array(t) for t in batch]


def _numpy_dtype(code):
    if code not in _DTYPES:
        raise TypeError(f"fsdp2 dtype {code} has no numpy equivalent (bfloat16)")
    return _DTYPES[code]

