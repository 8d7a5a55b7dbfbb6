"""fsdp2: Fully Sharded Data Parallel training (PyTorch's FSDP2) from Python.

A Pythonic layer over fsdp2's stable C ABI (c_api/fsdp2.h), whose SWIG
wrapper is the private module fsdp2.fsdp2_c. Names follow NeMo/Lightning's
FSDP2Strategy; data goes in and out as numpy arrays; handles are released by
close() or a with-block; every failure raises an fsdp2.Error subclass
carrying the library's message. Calls into the library release the GIL.

    import numpy as np, fsdp2

    with fsdp2.FSDP2Strategy(sharding_strategy="full_shard", precision="fp32") as s:
        s.setup_environment()                     # torchrun/srun/mpirun or one process
        with fsdp2.Model.gpt(vocab_size=256, n_layer=2) as model:
            s.connect(model, fsdp2.Optimizer(lr=3e-3))
        s.parallelize()
        loss = s.training_step([tokens, targets], batch_idx=0)
        s.save_checkpoint("/tmp/ckpt")
"""

import contextlib
import json
import os
import sys
import threading

import numpy as np

from . import fsdp2_c as _c

__all__ = [
    "Error", "InvalidArgumentError", "InvalidHandleError", "WrongOrderError",
    "ShapeError", "FileError", "CommunicationError", "FSDP2Strategy", "Model",
    "Optimizer", "TokenDataLoader", "StepResult", "launch_local",
    "is_rank_process", "version", "abi_version",
]


# ---------------------------------------------------------------------------
# Errors


class Error(Exception):
    """A failed fsdp2 call: `status` (e.g. "FSDP2_ERROR_SHAPE") and the
    library's message."""

    def __init__(self, status_code, status, message):
        super().__init__(f"{status}: {message}")
        self.status_code = status_code
        self.status = status
        self.message = message


class InvalidArgumentError(Error, ValueError):
    """A bad value, option, JSON text or NULL."""


class ShapeError(InvalidArgumentError):
    """An array's dtype or shape is not what the call needs."""


class InvalidHandleError(Error, ValueError):
    """A closed (destroyed) or foreign handle."""


class WrongOrderError(Error, RuntimeError):
    """A call made before what it needs, e.g. training before parallelize()."""


class FileError(Error, OSError):
    """A checkpoint or token file could not be read or written."""


class CommunicationError(Error, RuntimeError):
    """Collectives, timeouts and other runtime failures."""


_ERRORS = {
    1: InvalidArgumentError, 2: InvalidHandleError, 3: WrongOrderError,
    4: ShapeError, 5: FileError, 6: CommunicationError,
    7: type("OutOfMemoryError", (Error, MemoryError), {}),
}


def _make_error(status_code, status, message):
    return _ERRORS.get(status_code, Error)(status_code, status, message)


_c.fsdp2py_set_error_factory(_make_error)


def version():
    """The library's version string."""
    return _c.fsdp2_version_string()


def abi_version():
    return _c.fsdp2_abi_version()


#: The release version these bindings were built with (c_api/fsdp2.h).
__version__ = _c.FSDP2_VERSION


def _check_abi():
    """The loaded libfsdp2 must have the ABI the extension was compiled
    against: the same major number and at least its minor number."""
    abi = _c.fsdp2_abi_version()
    built = (_c.FSDP2_ABI_VERSION_MAJOR, _c.FSDP2_ABI_VERSION_MINOR)
    if abi // 1000 != built[0] or abi % 1000 < built[1]:
        raise ImportError(
            f"fsdp2 {__version__}: the loaded libfsdp2 has ABI {abi // 1000}.{abi % 1000}, but "
            f"these bindings ({os.path.dirname(os.path.abspath(_c.__file__))}) were built for "
            f"ABI {built[0]}.{built[1]}; install libfsdp2 and the Python package from the same "
            f"fsdp2 release")


_check_abi()

# ---------------------------------------------------------------------------
# Arrays

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


# ---------------------------------------------------------------------------
# Handles


class _Handle:
    """Owns one C handle; close() (or leaving a with-block) destroys it."""

    _destroy = None

    def __init__(self, handle):
        self._handle = handle

    @property
    def handle(self):
        if self._handle is None:
            raise InvalidHandleError(2, "FSDP2_ERROR_INVALID_HANDLE",
                                     f"this {type(self).__name__} is closed")
        return self._handle

    @property
    def closed(self):
        return self._handle is None

    def close(self):
        """Destroys the handle; further calls raise InvalidHandleError."""
        if self._handle is not None:
            type(self)._destroy(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _options_json(kwargs):
    return json.dumps(kwargs)


class Optimizer:
    """How to build the optimizer over the local shards: kind ("adamw",
    "adam", "sgd"), lr, beta1, beta2, eps, weight_decay, momentum."""

    def __init__(self, kind="adamw", **options):
        self._options = _c.fsdp2_optimizer_options_t()
        _c.fsdp2_optimizer_options_init(self._options)
        _c.fsdp2_optimizer_options_from_json(_options_json(dict(kind=kind, **options)),
                                             self._options)

    @property
    def lr(self):
        return self._options.lr


class Model(_Handle):
    """A model the strategy can train. Build with Model.gpt(), Model.mlp()
    or Model.from_torchscript(); see fsdp2.h for each family's batch."""

    _destroy = staticmethod(_c.fsdp2_model_destroy)

    @classmethod
    def from_config(cls, config):
        """`config`: a dict or JSON text with "family" and sizes. Inside a
        strategy's tensor_init_context() the model is built deferred."""
        text = config if isinstance(config, str) else json.dumps(config)
        deferred = getattr(_init_context, "strategy", None)
        if deferred is not None:
            return cls(_c.fsdp2_model_create_deferred(deferred.handle, text))
        return cls(_c.fsdp2_model_create(text))

    @classmethod
    def gpt(cls, **sizes):
        """GPT-style decoder: vocab_size, block_size, n_layer, n_head, n_embd.
        Batch: [tokens [B,T] int, targets [B,T] int]."""
        return cls.from_config(dict(family="gpt", **sizes))

    @classmethod
    def mlp(cls, **sizes):
        """Residual MLP: in_features, hidden, out_features, depth. Batch:
        [x [B,in] float, y [B,out] float (MSE) or [B] int (cross-entropy)]."""
        return cls.from_config(dict(family="mlp", **sizes))

    @classmethod
    def from_torchscript(cls, path, loss="mse"):
        """A TorchScript file (torch.jit.save); it trains as one FSDP unit."""
        return cls(_c.fsdp2_model_load_torchscript(os.fspath(path), loss))

    def num_parameters(self):
        """(parameter tensors, elements), global sizes."""
        return tuple(_c.fsdp2_model_num_parameters(self.handle))


_init_context = threading.local()


class StepResult(float):
    """A training step's loss (a float) with .loss, .grad_norm and .step."""

    def __new__(cls, loss, grad_norm, step):
        obj = super().__new__(cls, loss)
        obj.loss, obj.grad_norm, obj.step = loss, grad_norm, step
        return obj


class TokenDataLoader(_Handle):
    """Batches read natively from a token file (see
    FSDP2Strategy.token_dataloader)."""

    _destroy = staticmethod(_c.fsdp2_dataloader_destroy)

    def __len__(self):
        return _c.fsdp2_dataloader_num_batches(self.handle)

    def set_epoch(self, epoch):
        _c.fsdp2_dataloader_set_epoch(self.handle, int(epoch))


class FSDP2Strategy(_Handle):
    """NeMo/Lightning's FSDP2Strategy over fsdp2's C++ engine.

    Keyword options (as in fsdp2_strategy_options_t): data_parallel_size and
    tensor_parallel_size ("auto" or a number), sharding_strategy
    ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard"),
    reshard_after_forward, shard_group_size, precision ("bf16", "fp32"),
    cpu_offload, backend ("gloo", "nccl"), timeout_ms, checkpoint_format
    ("sharded", "full"), seed, shuffle, drop_last. Unknown options raise
    InvalidArgumentError with the library's message.
    """

    _destroy = staticmethod(_c.fsdp2_strategy_destroy)

    def __init__(self, **options):
        opts = _c.fsdp2_strategy_options_t()
        _c.fsdp2_strategy_options_init(opts)
        _c.fsdp2_strategy_options_from_json(_options_json(options), opts)
        super().__init__(_c.fsdp2_strategy_create(opts))
        self._model = None

    # -- set-up --------------------------------------------------------------
    def setup_environment(self):
        """Joins the job (collective), builds the (dp, tp) mesh, seeds."""
        _c.fsdp2_strategy_setup_environment(self.handle)

    def _rank_info(self):
        return _c.fsdp2_strategy_rank_info(self.handle)

    @property
    def rank(self):
        return self._rank_info()[0]

    @property
    def world_size(self):
        return self._rank_info()[1]

    @property
    def data_parallel_rank(self):
        return self._rank_info()[2]

    @property
    def data_parallel_size(self):
        return self._rank_info()[3]

    @contextlib.contextmanager
    def tensor_init_context(self):
        """Models built (Model.gpt/mlp/from_config) in this block take no
        parameter memory until parallelize(), which gives each rank only its
        rows, with values bit-identical to an eager build. After
        setup_environment()."""
        previous = getattr(_init_context, "strategy", None)
        _init_context.strategy = self
        try:
            yield self
        finally:
            _init_context.strategy = previous

    def connect(self, model, optimizer=None):
        """Attaches `model` (the strategy keeps its own reference, so the
        Model may be closed afterwards) and the optimizer to build: an
        Optimizer, a dict of its options, or None for AdamW defaults."""
        if isinstance(optimizer, dict):
            optimizer = Optimizer(**optimizer)
        _c.fsdp2_strategy_connect(self.handle, model.handle,
                                  optimizer._options if optimizer else None)

    def parallelize(self):
        """Shards the model (each block, then the root); builds the optimizer."""
        _c.fsdp2_strategy_parallelize(self.handle)

    # -- steps -----------------------------------------------------------------
    def training_step(self, batch, batch_idx=0, accumulate_grad_batches=1,
                      gradient_clip_val=0.0):
        """One optimizer step on this rank's rows; returns the loss (mean over
        micro-batches and data-parallel ranks) as a StepResult."""
        options = _c.fsdp2_step_options_t()
        _c.fsdp2_step_options_init(options)
        options.accumulate_grad_batches = int(accumulate_grad_batches)
        options.gradient_clip_val = float(gradient_clip_val)
        loss, norm, step = _c.fsdp2_strategy_training_step(
            self.handle, _batch(batch), int(batch_idx), options)
        return StepResult(loss, norm, step)

    def validation_step(self, batch, batch_idx=0):
        """The loss without gradients, averaged over data-parallel ranks."""
        return _c.fsdp2_strategy_validation_step(self.handle, _batch(batch), int(batch_idx))

    def test_step(self, batch, batch_idx=0):
        return _c.fsdp2_strategy_test_step(self.handle, _batch(batch), int(batch_idx))

    def predict_step(self, batch, batch_idx=0):
        """This rank's prediction as a new numpy array."""
        arrays = _batch(batch)
        dtype, shape = _c.fsdp2py_predict_shape(self.handle, arrays)
        out = np.empty(shape, dtype=_numpy_dtype(dtype))
        _c.fsdp2_strategy_predict_step(self.handle, arrays, int(batch_idx), out)
        return out

    def token_dataloader(self, path, block_size=64, global_batch_size=8,
                         token_dtype=np.uint8, begin_fraction=0.0, end_fraction=1.0):
        """A loader over a token file (uint8 bytes of text, uint16 or int32
        tokens): windows of block_size + 1 tokens, cut into global batches
        by the strategy's sampler."""
        codes = {np.dtype(np.uint8): _c.FSDP2_DTYPE_UINT8,
                 np.dtype(np.uint16): _c.FSDP2_DTYPE_UINT16,
                 np.dtype(np.int32): _c.FSDP2_DTYPE_INT32}
        if np.dtype(token_dtype) not in codes:
            raise TypeError("token_dtype must be uint8, uint16 or int32")
        options = _c.fsdp2_token_loader_options_t()
        _c.fsdp2_token_loader_options_init(options)
        options.token_dtype = codes[np.dtype(token_dtype)]
        options.block_size = int(block_size)
        options.global_batch_size = int(global_batch_size)
        options.begin_fraction = float(begin_fraction)
        options.end_fraction = float(end_fraction)
        return TokenDataLoader(_c.fsdp2_dataloader_create_from_token_file(
            self.handle, os.fspath(path), options))

    def training_step_loader(self, loader, batch_idx, accumulate_grad_batches=1,
                             gradient_clip_val=0.0):
        options = _c.fsdp2_step_options_t()
        _c.fsdp2_step_options_init(options)
        options.accumulate_grad_batches = int(accumulate_grad_batches)
        options.gradient_clip_val = float(gradient_clip_val)
        loss, norm, step = _c.fsdp2_strategy_training_step_loader(
            self.handle, loader.handle, int(batch_idx), options)
        return StepResult(loss, norm, step)

    def validation_step_loader(self, loader, batch_idx):
        return _c.fsdp2_strategy_validation_step_loader(self.handle, loader.handle,
                                                        int(batch_idx))

    # -- checkpoints and state ---------------------------------------------------
    def save_checkpoint(self, path):
        _c.fsdp2_strategy_save_checkpoint(self.handle, os.fspath(path))

    def load_checkpoint(self, path):
        _c.fsdp2_strategy_load_checkpoint(self.handle, os.fspath(path))

    def remove_checkpoint(self, path):
        _c.fsdp2_strategy_remove_checkpoint(self.handle, os.fspath(path))

    def optimizer_state_dict(self):
        """This rank's optimizer state (of its shards) as bytes."""
        return _c.fsdp2py_optimizer_state_dict(self.handle)

    def load_optimizer_state_dict(self, state):
        """Applied at the next training_step, once (deferred)."""
        _c.fsdp2_strategy_load_optimizer_state_dict(self.handle, bytes(state))

    @property
    def has_pending_optimizer_state(self):
        return bool(_c.fsdp2_strategy_has_pending_optimizer_state(self.handle))

    def parameter_names(self):
        return [info[0] for info in self._parameter_infos()]

    def _parameter_infos(self):
        count = _c.fsdp2_strategy_num_parameters(self.handle)
        return [_c.fsdp2py_parameter_info(self.handle, i) for i in range(count)]

    def get_parameter(self, name):
        """The full value of one parameter (collective)."""
        for pname, dtype, shape in self._parameter_infos():
            if pname == name:
                out = np.empty(shape, dtype=_numpy_dtype(dtype))
                _c.fsdp2_strategy_get_parameter(self.handle, name, out)
                return out
        # Let the library say what is wrong.
        _c.fsdp2_strategy_get_parameter(self.handle, name, np.empty(0, np.float32))
        raise AssertionError("unreachable")

    def set_parameter(self, name, value):
        """Sets one parameter from its full value (every rank passes it)."""
        _c.fsdp2_strategy_set_parameter(self.handle, name, _array(value))

    def lightning_module_state_dict(self):
        """Every parameter's full value, by name (collective)."""
        state = {}
        for name, dtype, shape in self._parameter_infos():
            out = np.empty(shape, dtype=_numpy_dtype(dtype))
            _c.fsdp2_strategy_get_parameter(self.handle, name, out)
            state[name] = out
        return state

    def load_model_state_dict(self, state):
        for name, value in state.items():
            self.set_parameter(name, value)

    @property
    def current_epoch_step(self):
        """(epoch, optimizer steps taken)."""
        return tuple(_c.fsdp2_strategy_current_epoch_step(self.handle))

    def set_epoch(self, epoch):
        _c.fsdp2_strategy_set_epoch(self.handle, int(epoch))

    def barrier(self):
        _c.fsdp2_strategy_barrier(self.handle)

    def teardown(self):
        _c.fsdp2_strategy_teardown(self.handle)


# ---------------------------------------------------------------------------
# Launching


def is_rank_process():
    """True in a process started as one rank (RANK, SLURM_PROCID or
    OMPI_COMM_WORLD_RANK set)."""
    return bool(_c.fsdp2_is_rank_process())


def launch_local(nproc, argv=None, threads_per_rank=0):
    """Runs this Python program again as `nproc` local ranks and waits;
    returns the exit code (0 when every rank succeeded). `argv`: the script
    and its arguments (default: sys.argv)."""
    args = [sys.executable] + list(sys.argv if argv is None else argv)
    return _c.fsdp2_launch_local(int(nproc), int(threads_per_rank), args)
