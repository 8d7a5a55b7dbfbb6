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

# One module per handle and concern; this one gathers their public names.
# The order matters: errors first (the C layer raises them from then on),
# then the check that the library fits these bindings.
from ._errors import (  # noqa: F401 (_ERROR_CLASSES, _ERRORS, _make_error: for tests)
    _ERROR_CLASSES, _ERRORS, CommunicationError, Error, FileError, InternalError,
    InvalidArgumentError, InvalidHandleError, OutOfMemoryError, ShapeError, WrongOrderError,
    _make_error)
from ._library import __version__, abi_version, allocator, version
from ._options import Optimizer, option_schema
from ._model import Model
from ._data import TokenDataLoader
from ._strategy import (MEMORY_STATS, STRATEGY_NAMES, FSDP2Strategy, StepResult, UnshardHandle,
                        strategy)
from ._launch import is_rank_process, launch_local, restart_count, restart_with_rank_environment

__all__ = [
    "Error", "InvalidArgumentError", "InvalidHandleError", "WrongOrderError",
    "ShapeError", "FileError", "CommunicationError", "OutOfMemoryError",
    "InternalError", "FSDP2Strategy", "Model",
    "Optimizer", "TokenDataLoader", "StepResult", "UnshardHandle", "launch_local",
    "is_rank_process", "version", "abi_version", "allocator", "restart_count",
    "restart_with_rank_environment", "option_schema",
    "MEMORY_STATS", "strategy", "STRATEGY_NAMES",
]
