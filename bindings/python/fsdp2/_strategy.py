"""FSDP2Strategy: one rank's strategy handle (set-up, steps, checkpoints,
state, memory), and what its steps return."""

import contextlib
import json
import os

import numpy as np

from . import fsdp2_c as _c
from ._arrays import _array, _batch, _numpy_dtype
from ._data import TokenDataLoader
from ._errors import InvalidArgumentError
from ._handle import _Handle
from ._model import _init_context
from ._options import Optimizer, _step_options, _with_options


class UnshardHandle(_Handle):
    """An all-gather started by FSDP2Strategy.unshard(module, async_op=True),
    as PyTorch's FSDPModule.unshard returns: wait() completes it (the
    module's forward, or reshard(), would too)."""

    _destroy = staticmethod(_c.fsdp2_unshard_handle_destroy)

    def wait(self):
        """Waits for the all-gather: the module's parameters are then whole.
        Frees the handle (a handle waits once; close() frees one without
        waiting). InvalidHandleError once closed."""
        try:
            _c.fsdp2_unshard_handle_wait(self.handle)
        finally:
            self.close()


class StepResult(float):
    """A training step's loss (a float) with .loss, .grad_norm and .step."""

    def __new__(cls, loss, grad_norm, step):
        """Made by training_step(_loader): `loss` (float, the mean over
        micro-batches and data-parallel ranks, also the value of the float
        itself), `grad_norm` (global norm before clipping; 0.0 without
        clipping) and `step` (int, optimizer steps taken so far)."""
        obj = super().__new__(cls, loss)
        obj.loss, obj.grad_norm, obj.step = loss, grad_norm, step
        return obj



#: The keys of FSDP2Strategy.memory_stats(), in the C struct's order.
MEMORY_STATS = (
    "sharded_param_bytes", "sharded_grad_bytes", "optimizer_state_bytes",
    "unsharded_param_bytes", "peak_unsharded_param_bytes", "unsharded_grad_bytes",
    "total_param_bytes", "rss_bytes", "peak_rss_bytes",
    "device_allocated_bytes", "device_reserved_bytes",
    "peak_device_allocated_bytes", "peak_device_reserved_bytes",
)



class FSDP2Strategy(_Handle):
    """NeMo/Lightning's FSDP2Strategy over fsdp2's C++ engine.

    Its keyword options are the library's strategy options (the rows of
    option_schema()["strategy"], the fields of fsdp2_strategy_options_t);
    __init__ lists them with their defaults and what each does and costs.
    Unknown options and values out of their range raise InvalidArgumentError
    with the library's message; names the model does not have raise it from
    parallelize().
    """

    _destroy = staticmethod(_c.fsdp2_strategy_destroy)

    def __init__(self, **options):
        """Creates the strategy (no communication yet) from keyword options,
        the keys of fsdp2_strategy_create_from_json; those not given keep
        the library's defaults, below. A name list (ignored_params,
        frozen_params) may be a list or one comma-separated string; a
        prefetch list (forward_prefetch_modules, backward_prefetch_modules)
        a dict such as {"blocks.0": ["blocks.1"]} or the C string form. An
        unknown key, a wrong type or a value out of its range raises
        InvalidArgumentError; a value json cannot encode raises TypeError.
        The options, their defaults and what each does:"""
        super().__init__(_c.fsdp2_strategy_create_from_json(json.dumps(options)))
        self._model = None

    # -- set-up --------------------------------------------------------------
    def setup_environment(self):
        """Joins the job (collective), builds the (dp, tp) mesh, seeds."""
        _c.fsdp2_strategy_setup_environment(self.handle)

    def _rank_info(self):
        return _c.fsdp2_strategy_rank_info(self.handle)

    @property
    def rank(self):
        """This process's global rank (int). WrongOrderError before
        setup_environment()."""
        return self._rank_info()[0]

    @property
    def world_size(self):
        """The number of ranks in the job (int). WrongOrderError before
        setup_environment()."""
        return self._rank_info()[1]

    @property
    def data_parallel_rank(self):
        """This rank's index among the data-parallel ranks (int), which
        decides its rows of each global batch. WrongOrderError before
        setup_environment()."""
        return self._rank_info()[2]

    @property
    def data_parallel_size(self):
        """The number of data-parallel ranks (int): world_size divided by
        the tensor-parallel size. WrongOrderError before
        setup_environment()."""
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
    def training_step(self, batch, batch_idx=0, accumulate_grad_batches=None,
                      gradient_clip_val=None, **step_options):
        """One optimizer step on this rank's rows; returns the loss (mean over
        micro-batches and data-parallel ranks) as a StepResult. The step
        options (option_schema()["step"]), those not given at the library's
        defaults:"""
        options = _step_options(accumulate_grad_batches=accumulate_grad_batches,
                                gradient_clip_val=gradient_clip_val, **step_options)
        loss, norm, step = _c.fsdp2_strategy_training_step(
            self.handle, _batch(batch), int(batch_idx), options)
        return StepResult(loss, norm, step)

    def validation_step(self, batch, batch_idx=0):
        """The loss without gradients, averaged over data-parallel ranks."""
        return _c.fsdp2_strategy_validation_step(self.handle, _batch(batch), int(batch_idx))

    def test_step(self, batch, batch_idx=0):
        """Collective. As validation_step, through the model's test step:
        the loss of `batch` (an array or a list of arrays, this rank's rows)
        without gradients, averaged over the data-parallel ranks, as a
        float. WrongOrderError before parallelize(); ShapeError for arrays
        the model cannot take."""
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
        by the strategy's sampler. `path` may also be a directory written by
        fsdp2.prepare_data (docs/data-format.md): its rows of seq_len tokens
        (block_size and token_dtype are then not used), each batch
        [tokens, targets, segments] with -100 targets not learned and
        documents packed, for a Model.from_hf() model."""
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

    def training_step_loader(self, loader, batch_idx, accumulate_grad_batches=None,
                             gradient_clip_val=None, **step_options):
        """Collective. As training_step on global batch `batch_idx` of
        `loader` (a TokenDataLoader of this strategy), read natively without
        copying through Python; returns a StepResult. accumulate_grad_batches
        splits this rank's rows into that many micro-batches (ShapeError
        unless they divide evenly); gradient_clip_val is the global max norm.
        InvalidArgumentError for a batch_idx outside range(len(loader)),
        WrongOrderError before parallelize(). The step options, those not
        given at the library's defaults:"""
        options = _step_options(accumulate_grad_batches=accumulate_grad_batches,
                                gradient_clip_val=gradient_clip_val, **step_options)
        loss, norm, step = _c.fsdp2_strategy_training_step_loader(
            self.handle, loader.handle, int(batch_idx), options)
        return StepResult(loss, norm, step)

    def validation_step_loader(self, loader, batch_idx):
        """Collective. As validation_step on global batch `batch_idx` of
        `loader`: the loss without gradients, averaged over the
        data-parallel ranks, as a float. InvalidArgumentError for a
        batch_idx outside range(len(loader)), WrongOrderError before
        parallelize()."""
        return _c.fsdp2_strategy_validation_step_loader(self.handle, loader.handle,
                                                        int(batch_idx))

    # -- checkpoints and state ---------------------------------------------------
    def save_checkpoint(self, path, asynchronous=False):
        """Collective. With asynchronous=True the files are written by a
        background thread while training goes on (at most one save in
        flight; see wait_for_checkpoint)."""
        flags = _c.FSDP2_SAVE_ASYNC if asynchronous else 0
        _c.fsdp2_strategy_save_checkpoint_ex(self.handle, os.fspath(path), flags)

    def save_hf(self, path, max_shard_size="5GB", dtype=None, merged=False):
        """Collective. Writes a Model.from_hf() model back as transformers'
        save_pretrained does (config.json; model.safetensors, or shards of
        at most max_shard_size with their index), in `dtype` ("bfloat16",
        ...) or the parameters' own, with the source's tokenizer files and
        generation_config.json: from_pretrained(path) loads it and
        generates. A model with LoRA adapters saves only them, in PEFT's
        layout (PeftModel.from_pretrained(base, path) loads them), unless
        `merged`: then the whole model with the adapters merged in."""
        options = {"max_shard_size": max_shard_size, "merged": bool(merged)}
        if dtype is not None:
            options["dtype"] = dtype
        _c.fsdp2_strategy_save_hf_checkpoint(self.handle, os.fspath(path), json.dumps(options))

    def wait_for_checkpoint(self):
        """Waits for this rank's background save; raises its error."""
        _c.fsdp2_strategy_wait_for_checkpoint(self.handle)

    @property
    def checkpoint_in_flight(self):
        """True while this rank is still writing a background save
        (save_checkpoint(asynchronous=True)), else False. Local."""
        return bool(_c.fsdp2_strategy_checkpoint_in_flight(self.handle))

    def load_checkpoint(self, path):
        """Collective. Loads a checkpoint of either format, saved on any
        number of ranks, into the parallelized model and optimizer, and
        restores current_epoch_step; a pending optimizer state is dropped.
        Waits for a background save first. Every checksum is verified; on
        error the model is unchanged. FileError for a missing or corrupt
        checkpoint, WrongOrderError before parallelize() or after
        teardown()."""
        _c.fsdp2_strategy_load_checkpoint(self.handle, os.fspath(path))

    def remove_checkpoint(self, path):
        """Collective. Deletes the checkpoint at `path` (rank 0 does, after
        a barrier; a background save is waited for first). Refuses, with
        FileError on every rank, a path that is not an fsdp2 checkpoint.
        WrongOrderError before setup_environment()."""
        _c.fsdp2_strategy_remove_checkpoint(self.handle, os.fspath(path))

    def optimizer_state_dict(self):
        """This rank's optimizer state (of its shards) as bytes."""
        return _c.fsdp2py_optimizer_state_dict(self.handle)

    def load_optimizer_state_dict(self, state):
        """Applied at the next training_step, once (deferred)."""
        _c.fsdp2_strategy_load_optimizer_state_dict(self.handle, bytes(state))

    @property
    def has_pending_optimizer_state(self):
        """True while a state given to load_optimizer_state_dict waits to be
        applied at the next training step, else False."""
        return bool(_c.fsdp2_strategy_has_pending_optimizer_state(self.handle))

    def parameter_names(self):
        """The model's parameter names (a list of str), in its
        named_parameters() order, as before sharding: the keys of
        lightning_module_state_dict(). WrongOrderError before
        parallelize()."""
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
        """`state`: {name: array}, or the path of a safetensors file (a
        PyTorch state_dict() saved as safetensors, or a full checkpoint) or
        of a Hugging Face checkpoint directory (read row by row)."""
        if isinstance(state, (str, os.PathLike)):
            _c.fsdp2_strategy_load_model_state_dict_file(self.handle, os.fspath(state))
            return
        for name, value in state.items():
            self.set_parameter(name, value)

    # -- explicit unshard and reshard ------------------------------------
    def unshard(self, module, async_op=False):
        """Collective over the module's shard group: all-gathers the
        parameters of the sharded module named `module` (as the model names
        its modules: "blocks.0"; "" is the root) ahead of its forward, which
        then finds them gathered and reshards after it as configured
        (PyTorch's FSDPModule.unshard). async_op=False returns once they are
        gathered, and None; True returns at once an UnshardHandle whose
        wait() completes the all-gather. After parallelize()
        (WrongOrderError); InvalidArgumentError naming a module that is not
        a sharded module of the model. Every rank makes the same calls in
        the same order."""
        handle = UnshardHandle(_c.fsdp2_strategy_unshard(self.handle, module, 1 if async_op else 0))
        if async_op:
            return handle
        handle.close()
        return None

    def reshard(self, module):
        """Collective over the module's shard group: frees the gathered
        parameters of the sharded module named `module`, waiting for an
        all-gather in flight; nothing when they are sharded (PyTorch's
        FSDPModule.reshard). Errors as unshard()."""
        _c.fsdp2_strategy_reshard(self.handle, module)

    def memory_stats(self):
        """What this rank holds, in bytes, as a dict (the fields of the C
        fsdp2_memory_stats_t): sharded_param_bytes, sharded_grad_bytes,
        optimizer_state_bytes (the optimizer's state tensors on this rank),
        unsharded_param_bytes (full-size copies units compute with, alive
        now: gathered shards or bf16 casts, in the compute dtype),
        peak_unsharded_param_bytes (their high-water mark since parallelize()
        or reset_peak_memory_stats()), unsharded_grad_bytes,
        total_param_bytes (the whole model, unsharded, in the parameters'
        dtype), rss_bytes and peak_rss_bytes (the process's resident memory
        now and its peak), and on a GPU device_allocated_bytes,
        device_reserved_bytes and their peaks (PyTorch's caching allocator;
        0 on the CPU). Local, not collective; after parallelize()."""
        stats = _c.fsdp2_memory_stats_t()
        _c.fsdp2_memory_stats_init(stats)
        _c.fsdp2_strategy_memory_stats(self.handle, stats)
        return {name: int(getattr(stats, name)) for name in MEMORY_STATS}

    def reset_peak_memory_stats(self):
        """Starts a new measurement: peak_unsharded_param_bytes and
        peak_rss_bytes restart from what is held now (both process-wide)."""
        _c.fsdp2_strategy_reset_peak_memory_stats(self.handle)

    @property
    def current_epoch_step(self):
        """(epoch, optimizer steps taken)."""
        return tuple(_c.fsdp2_strategy_current_epoch_step(self.handle))

    def set_epoch(self, epoch):
        """Sets the epoch counter (an int >= 0, else InvalidArgumentError)
        that checkpoints save and current_epoch_step reports. It does not
        reshuffle a loader: call TokenDataLoader.set_epoch for that."""
        _c.fsdp2_strategy_set_epoch(self.handle, int(epoch))

    def barrier(self):
        """Collective. Returns once every rank has called it.
        WrongOrderError before setup_environment(); CommunicationError when
        a rank does not arrive within timeout_ms."""
        _c.fsdp2_strategy_barrier(self.handle)

    def teardown(self):
        """Waits for a background save (raising its error), then drops the
        optimizer and any pending optimizer state: the strategy can no
        longer train or load checkpoints. close() tears down as well and
        frees the handle."""
        _c.fsdp2_strategy_teardown(self.handle)


_with_options(FSDP2Strategy.__init__, "strategy")
_with_options(FSDP2Strategy.training_step, "step",
              positional=("accumulate_grad_batches", "gradient_clip_val"))
_with_options(FSDP2Strategy.training_step_loader, "step",
              positional=("accumulate_grad_batches", "gradient_clip_val"))


# Lightning's names for its FSDP strategies (its StrategyRegistry): the
# options each name stands for.
STRATEGY_NAMES = {
    "fsdp": {},
    "fsdp_cpu_offload": {"cpu_offload": True},
}


def strategy(name="fsdp", **options):
    """The FSDP2Strategy that Lightning's strategy name stands for, as in
    Trainer(strategy="fsdp_cpu_offload"): "fsdp" (the defaults) or
    "fsdp_cpu_offload" (cpu_offload=True). Further keyword options are
    FSDP2Strategy's and win over the name's. An unknown name raises
    InvalidArgumentError naming the known ones."""
    if name not in STRATEGY_NAMES:
        raise InvalidArgumentError(
            _c.FSDP2_ERROR_INVALID_ARGUMENT, "FSDP2_ERROR_INVALID_ARGUMENT",
            f"unknown strategy name {name!r} (known: {', '.join(sorted(STRATEGY_NAMES))})")
    return FSDP2Strategy(**{**STRATEGY_NAMES[name], **options})
