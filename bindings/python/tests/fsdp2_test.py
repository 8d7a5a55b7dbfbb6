"""pytest tests of the fsdp2 Python package (run by `bazel test`).

Multi-rank runs start this file again as worker processes (RANK,
WORLD_SIZE and FSDP2_STORE_PATH set: ranks meet through a FileStore), each
with a timeout, and compare with a 1-rank run of the same global batch.
"""

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest

import fsdp2

GPT = dict(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)
TORCH_GPT = dict(vocab_size=48, block_size=12, n_layer=2, n_head=2, n_embd=32)
GLOBAL_ROWS = 12


def _tmp():
    return os.environ.get("TEST_TMPDIR") or tempfile.gettempdir()


def global_batch(step):
    """A learnable global batch: rows count up in steps of 3."""
    rng = np.random.default_rng(1000 + step)
    start = rng.integers(0, GPT["vocab_size"], size=(GLOBAL_ROWS, 1))
    seq = (start + 3 * np.arange(GPT["block_size"] + 1)) % GPT["vocab_size"]
    return seq[:, :-1].astype(np.int64), seq[:, 1:].astype(np.int64)


def new_strategy(dropout=0.0, **options):
    s = fsdp2.FSDP2Strategy(**{"precision": "fp32", "seed": 11, **options})
    s.setup_environment()
    with fsdp2.Model.gpt(**GPT, dropout=dropout) as model:
        s.connect(model, fsdp2.Optimizer(lr=0.01))
    s.parallelize()
    return s


def local_rows(s, step):
    tokens, targets = global_batch(step)
    n = GLOBAL_ROWS // s.data_parallel_size
    r = s.data_parallel_rank
    return [tokens[r * n:(r + 1) * n], targets[r * n:(r + 1) * n]]


def unshard_ahead(s, step):
    """Gathers blocks.1 (asynchronously) and the root ahead of `step`;
    frees both again before odd steps, so their forwards gather them."""
    before = s.memory_stats()["unsharded_param_bytes"]
    s.unshard("blocks.1", async_op=True).wait()
    assert s.unshard("") is None
    gathered = s.memory_stats()["unsharded_param_bytes"]
    assert s.world_size == 1 or gathered > before, (before, gathered)
    if step % 2 == 1:
        s.reshard("blocks.1")
        s.reshard("")
        assert s.memory_stats()["unsharded_param_bytes"] == before


# ---------------------------------------------------------------------------
# Worker side


def worker(scenario, out, *args):
    if scenario == "train":
        # steps, checkpoint dir or "-", [activation checkpointing, dropout,
        # "unshard": gather blocks ahead of each step, free them before odd ones]
        steps, ckpt = int(args[0]), args[1]
        ac = args[2] if len(args) > 2 else "none"
        dropout = float(args[3]) if len(args) > 3 else 0.0
        unshard = len(args) > 4 and args[4] == "unshard"
        with new_strategy(dropout=dropout, activation_checkpointing=ac) as s:
            losses = []
            for i in range(steps):
                if unshard:
                    unshard_ahead(s, i)
                losses.append(float(s.training_step(local_rows(s, i), i,
                                                    accumulate_grad_batches=2,
                                                    gradient_clip_val=0.5)))
            if ckpt != "-":
                s.save_checkpoint(ckpt)
            state = s.lightning_module_state_dict()  # collective
            if s.rank == 0:
                np.savez(out, losses=np.array(losses),
                         **{k.replace(".", "_"): v for k, v in state.items()})
    elif scenario == "resume":
        ckpt, steps = args[0], int(args[1])
        with new_strategy() as s:
            s.load_checkpoint(ckpt)
            _, start = s.current_epoch_step
            losses = [float(s.training_step(local_rows(s, i), i, accumulate_grad_batches=2,
                                            gradient_clip_val=0.5)) for i in range(start, steps)]
            if s.rank == 0:
                np.savez(out, losses=np.array(losses))
    elif scenario == "from_pytorch":
        # A PyTorch state_dict() saved as safetensors loads into fsdp2, which
        # trains on from it on PyTorch's batches.
        ref, steps = args[0], int(args[1])
        with open(os.path.join(ref, "losses.json")) as f:
            torch_run = json.load(f)
        adamw = torch_run["adamw"]
        batches = np.load(os.path.join(ref, "batches.npz"))
        with fsdp2.FSDP2Strategy(precision="fp32", seed=11) as s:
            s.setup_environment()
            with fsdp2.Model.gpt(**TORCH_GPT) as model:
                s.connect(model, fsdp2.Optimizer(
                    lr=torch_run["lr"], beta1=adamw["betas"][0], beta2=adamw["betas"][1],
                    eps=adamw["eps"], weight_decay=adamw["weight_decay"]))
            s.parallelize()
            s.load_model_state_dict(os.path.join(ref, "state.safetensors"))
            n = len(batches["tokens0"]) // s.data_parallel_size
            r = s.data_parallel_rank
            losses = [float(s.training_step([batches["tokens%d" % i][r * n:(r + 1) * n],
                                             batches["targets%d" % i][r * n:(r + 1) * n]], i))
                      for i in range(steps)]
            if s.rank == 0:
                np.savez(out, losses=np.array(losses))
    elif scenario == "memory":
        # memory_stats() after parallelize, after two steps and after a reset,
        # with the parameters' global bytes; every rank writes OUT.<rank>.json.
        options = json.loads(args[0])
        with new_strategy(**options) as s:
            global_bytes = sum(int(np.prod(shape)) * 4 for _, _, shape in s._parameter_infos())
            built = s.memory_stats()
            for i in range(2):
                s.training_step(local_rows(s, i), i)
            trained = s.memory_stats()
            s.reset_peak_memory_stats()
            reset = s.memory_stats()
            with open(f"{out}.{s.rank}.json", "w") as f:
                json.dump(dict(built=built, trained=trained, reset=reset,
                               global_bytes=global_bytes), f)
            if s.rank == 0:
                np.savez(out, done=np.array([1]))
    elif scenario == "ac_memory":
        # One rank, a GPT whose activations outweigh the rest (8 blocks, 16
        # rows of 128 tokens), activation checkpointing args[0]: after a
        # first step, how much the second grows the resident memory (peak
        # after, size before).
        with fsdp2.FSDP2Strategy(precision="fp32", seed=11, activation_checkpointing=args[0]) as s:
            s.setup_environment()
            with fsdp2.Model.gpt(vocab_size=32, block_size=128, n_layer=8, n_head=4,
                                 n_embd=32) as model:
                s.connect(model, fsdp2.Optimizer(lr=0.01))
            s.parallelize()
            tokens = (np.arange(16 * 128).reshape(16, 128) * 7 % 32).astype(np.int64)
            s.training_step([tokens, (tokens + 1) % 32], 0)
            s.reset_peak_memory_stats()
            before = s.memory_stats()
            s.training_step([tokens, (tokens + 1) % 32], 1)
            after = s.memory_stats()
            np.savez(out, growth=np.array([after["peak_rss_bytes"] - before["rss_bytes"]]))
    elif scenario == "setup":
        with fsdp2.FSDP2Strategy() as s:
            s.setup_environment()
    elif scenario == "restart_then_setup":
        # A rank script's first lines under an outside launcher; OUT counts
        # the runs of this process.
        with open(out, "a") as f:
            f.write("run\n")
        fsdp2.restart_with_rank_environment()
        with fsdp2.FSDP2Strategy() as s:
            s.setup_environment()
        print("allocator", fsdp2.allocator(),
              "wait", os.environ.get("OMP_WAIT_POLICY", "(unset)"), flush=True)
    elif scenario == "barrier_after":
        import time
        with fsdp2.FSDP2Strategy(timeout_ms=20000) as s:
            s.setup_environment()
            deadline = time.monotonic() + 60
            while not os.path.exists(out) and time.monotonic() < deadline:
                time.sleep(0.01)
            s.barrier()
    else:
        raise SystemExit(f"unknown scenario {scenario}")


def launch(world, scenario, *args):
    """Runs `world` ranks of a scenario; returns rank 0's saved arrays."""
    out = os.path.join(_tmp(), f"{scenario}_{world}_{len(os.listdir(_tmp()))}.npz")
    return launch_to(out, world, scenario, *args)


def launch_to(out, world, scenario, *args):
    """launch() with the output path given."""
    store = out + ".store"
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), FSDP2_STORE_PATH=store,
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--worker", scenario, out, *map(str, args)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0].decode())
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{scenario} on {world} ranks timed out")
    for p, log in zip(procs, logs):
        assert p.returncode == 0, f"a rank of {scenario} on {world} ranks failed:\n{log}"
    return dict(np.load(out))


# ---------------------------------------------------------------------------
# Tests


def test_a_background_save_writes_what_a_synchronous_one_does(tmp_path):
    os.environ["FSDP2_STORE_PATH"] = str(tmp_path / "store")
    try:
        with new_strategy() as s:
            s.training_step(local_rows(s, 0), 0)
            s.save_checkpoint(tmp_path / "sync")
            s.save_checkpoint(tmp_path / "async", asynchronous=True)
            s.training_step(local_rows(s, 1), 1)  # training goes on
            s.wait_for_checkpoint()
            assert not s.checkpoint_in_flight
            names = sorted(os.listdir(tmp_path / "sync"))
            assert names == sorted(os.listdir(tmp_path / "async")) and names
            for name in names:
                assert (tmp_path / "sync" / name).read_bytes() == \
                    (tmp_path / "async" / name).read_bytes(), name
            s.load_checkpoint(tmp_path / "async")
            assert s.current_epoch_step == (0, 1)
    finally:
        del os.environ["FSDP2_STORE_PATH"]


def test_a_pytorch_state_dict_loads_and_trains_with_pytorchs_losses(tmp_path):
    # PyTorch (the venv's, its own process) builds the same GPT,
    # saves its state_dict() as safetensors with plain Python and numpy, and
    # trains 4 AdamW steps; fsdp2 loads that file on 1 and 2 ranks and trains
    # on the same batches with the same losses.
    steps = 4
    subprocess.run([sys.executable, "core/checkpoint/pytorch_reference.py", "train",
                    str(tmp_path), json.dumps(TORCH_GPT), str(steps)], check=True)
    with open(tmp_path / "losses.json") as f:
        want = json.load(f)["losses"]
    for world in (1, 2):
        got = launch(world, "from_pytorch", tmp_path, steps)["losses"]
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{world} ranks")
    # A path that is not a safetensors file is a FileError naming it.
    os.environ["FSDP2_STORE_PATH"] = str(tmp_path / "store")
    try:
        with new_strategy() as s:
            with pytest.raises(fsdp2.FileError, match="batches.npz"):
                s.load_model_state_dict(tmp_path / "batches.npz")
            with pytest.raises(fsdp2.InvalidArgumentError, match="has shape"):
                s.load_model_state_dict(str(tmp_path / "state.safetensors"))  # other sizes
    finally:
        del os.environ["FSDP2_STORE_PATH"]


def test_version():
    assert "fsdp2" in fsdp2.version()
    assert fsdp2.abi_version() >= 1000


def test_every_status_of_the_header_has_its_exception_class():
    from fsdp2 import _status, fsdp2_c
    # The generated table holds every FSDP2_ERROR_* constant SWIG took from
    # the header, with SWIG's value.
    header = {name for name in dir(fsdp2_c) if name.startswith("FSDP2_ERROR_")}
    assert {"FSDP2_ERROR_" + n for n in _status.STATUSES if n != "OK"} == header
    for name, code in _status.STATUSES.items():
        assert code == getattr(fsdp2_c, "FSDP2_OK" if name == "OK" else "FSDP2_ERROR_" + name)
        if name == "OK":
            continue
        # Each error status has its own class, not the catch-all base.
        assert name in fsdp2._ERROR_CLASSES, f"status {name} has no exception class"
        cls = fsdp2._ERRORS[code]
        assert cls is not fsdp2.Error and issubclass(cls, fsdp2.Error)
        error = fsdp2._make_error(code, fsdp2_c.fsdp2_status_name(code), "message")
        assert isinstance(error, cls) and error.status == "FSDP2_ERROR_" + name


def test_unknown_option_raises_with_the_c_message():
    with pytest.raises(fsdp2.InvalidArgumentError, match='unknown option "data_paralel_size"'):
        fsdp2.FSDP2Strategy(data_paralel_size=2)
    with pytest.raises(fsdp2.InvalidArgumentError, match="full_shard"):
        fsdp2.FSDP2Strategy(sharding_strategy="zero3")
    with pytest.raises(fsdp2.InvalidArgumentError, match="unknown model family"):
        fsdp2.Model.from_config({"family": "rnn"})
    with pytest.raises(ValueError):  # the error classes are also ValueErrors
        fsdp2.Optimizer(kind="lamb")


def test_torchscript_errors_name_the_file_and_the_loss(tmp_path):
    # Training a TorchScript model is tested in C (//c_api:torchscript_test);
    # here: paths (str or PathLike) reach the library and its errors come back.
    missing = tmp_path / "net.pt"
    with pytest.raises(fsdp2.FileError, match=f"TorchScript file {missing} does not exist"):
        fsdp2.Model.from_torchscript(missing)
    not_zip = tmp_path / "net.txt"
    not_zip.write_text("not a TorchScript archive")
    with pytest.raises(fsdp2.FileError, match="cannot load TorchScript file .*net.txt"):
        fsdp2.Model.from_torchscript(str(not_zip))
    with pytest.raises(fsdp2.InvalidArgumentError, match='"mse", "cross_entropy" or "model", got "hinge"'):
        fsdp2.Model.from_torchscript(not_zip, loss="hinge")


def test_calls_in_the_wrong_order_and_closed_handles(tmp_path):
    os.environ["FSDP2_STORE_PATH"] = str(tmp_path / "store")
    try:
        s = fsdp2.FSDP2Strategy(precision="fp32")
        with pytest.raises(fsdp2.WrongOrderError, match="setup_environment"):
            s.parallelize()
        s.setup_environment()
        tokens, targets = global_batch(0)
        with pytest.raises(fsdp2.WrongOrderError, match="parallelize"):
            s.training_step([tokens, targets], 0)
        model = fsdp2.Model.gpt(**GPT)
        s.connect(model, {"lr": 0.01})
        model.close()
        with pytest.raises(fsdp2.InvalidHandleError, match="closed"):
            model.num_parameters()
        with pytest.raises(fsdp2.WrongOrderError, match="parallelize"):
            s.memory_stats()
        with pytest.raises(fsdp2.WrongOrderError, match="parallelize"):
            s.reset_peak_memory_stats()
        s.parallelize()
        s.close()
        assert s.closed
        with pytest.raises(fsdp2.InvalidHandleError):
            s.memory_stats()
        with pytest.raises(fsdp2.InvalidHandleError):
            s.training_step([tokens, targets], 0)
    finally:
        del os.environ["FSDP2_STORE_PATH"]


def test_arrays_in_and_out(tmp_path):
    os.environ["FSDP2_STORE_PATH"] = str(tmp_path / "store")
    try:
        with new_strategy() as s:
            tokens, targets = global_batch(0)
            with pytest.raises(fsdp2.ShapeError, match="integer tensor"):
                s.training_step([tokens.astype(np.float32), targets], 0)
            with pytest.raises(fsdp2.ShapeError, match="micro-batches"):
                s.training_step([tokens, targets], 0, accumulate_grad_batches=5)
            with pytest.raises(TypeError, match="fsdp2 does not take"):
                s.training_step([tokens.astype(np.complex64), targets], 0)
            # Non-contiguous arrays are made contiguous by the package.
            loss = s.training_step([np.asfortranarray(tokens), targets], 0)
            assert 0 < loss < 10 and loss.step == 1
            assert s.validation_step([tokens, targets]) > 0
            logits = s.predict_step([tokens])
            assert logits.shape == (GLOBAL_ROWS, GPT["block_size"], GPT["vocab_size"])
            assert logits.dtype == np.float32
            # Parameters by name, numpy in and out.
            names = s.parameter_names()
            assert names[0] == "wte.weight" and "blocks.1.fc.weight" in names
            wpe = s.get_parameter("wpe.weight")
            assert wpe.shape == (GPT["block_size"], GPT["n_embd"])
            new = np.arange(wpe.size, dtype=np.float32).reshape(wpe.shape) / 100
            s.set_parameter("wpe.weight", new)
            np.testing.assert_array_equal(s.get_parameter("wpe.weight"), new)
            with pytest.raises(fsdp2.ShapeError, match="dtype"):
                s.set_parameter("wpe.weight", new.astype(np.float64))
            with pytest.raises(fsdp2.InvalidArgumentError, match="no parameter named"):
                s.get_parameter("wpe.bias")
            state = s.lightning_module_state_dict()
            s.load_model_state_dict(state)
            # Deferred optimizer state.
            blob = s.optimizer_state_dict()
            assert isinstance(blob, bytes) and len(blob) > 100
            s.load_optimizer_state_dict(blob)
            assert s.has_pending_optimizer_state
            s.training_step([tokens, targets], 1)
            assert not s.has_pending_optimizer_state
            assert s.current_epoch_step == (0, 2)
            with pytest.raises(fsdp2.FileError):
                s.load_checkpoint(tmp_path / "missing")
    finally:
        del os.environ["FSDP2_STORE_PATH"]


def test_tensor_init_context_equals_eager(tmp_path):
    states = []
    for i, deferred in enumerate([False, True]):
        os.environ["FSDP2_STORE_PATH"] = str(tmp_path / f"store{i}")
        try:
            with fsdp2.FSDP2Strategy(precision="fp32", seed=3) as s:
                s.setup_environment()
                context = s.tensor_init_context() if deferred else contextlib.nullcontext()
                with context:
                    model = fsdp2.Model.gpt(**GPT)
                s.connect(model)
                model.close()
                s.parallelize()
                states.append(s.lightning_module_state_dict())
        finally:
            del os.environ["FSDP2_STORE_PATH"]
    eager, deferred = states
    assert eager.keys() == deferred.keys()
    for name in eager:
        np.testing.assert_array_equal(deferred[name], eager[name], err_msg=name)


def test_long_calls_release_the_gil(tmp_path):
    """A thread waits inside barrier() (C) for a peer process that joins only
    after this thread writes a file. Writing it needs the GIL: if the
    wrapper kept the GIL during the C call, the barrier would time out."""
    go = tmp_path / "go"
    store = str(tmp_path / "store")
    peer = subprocess.Popen(
        [sys.executable, __file__, "--worker", "barrier_after", str(go)],
        env=dict(os.environ, RANK="1", WORLD_SIZE="2", FSDP2_STORE_PATH=store))
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "FSDP2_STORE_PATH")}
    os.environ.update(RANK="0", WORLD_SIZE="2", FSDP2_STORE_PATH=store)
    try:
        with fsdp2.FSDP2Strategy(timeout_ms=20000) as s:
            s.setup_environment()
            entered, errors = threading.Event(), []

            def wait_in_barrier():
                entered.set()
                try:
                    s.barrier()
                except fsdp2.Error as e:
                    errors.append(e)

            t = threading.Thread(target=wait_in_barrier)
            t.start()
            entered.wait()
            go.write_text("go")
            t.join(60)
            assert not t.is_alive() and not errors, errors
        assert peer.wait(60) == 0
    finally:
        peer.kill()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _outside_rank(scenario, out, **env_changes):
    """Runs this file's worker `scenario` as one rank of an outside launcher:
    none of what launch_local gives its ranks, os.environ changed by
    `env_changes`. Returns the finished process (it must exit 0)."""
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "FSDP2_STORE_PATH", "LD_PRELOAD", "FSDP2_ALLOCATOR",
              "OMP_WAIT_POLICY"):
        env.pop(k, None)
    env.update(env_changes)
    r = subprocess.run([sys.executable, __file__, "--worker", scenario, str(out)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r


def _setup_stderr(**env_changes):
    """stderr of an outside launcher's rank that calls setup_environment()."""
    return _outside_rank("setup", "-", **env_changes).stderr


def test_a_rank_without_the_allocator_is_told_how_to_start():
    """A Python rank an outside launcher started without tcmalloc (installed by
    scripts/setup.sh) is told the LD_PRELOAD that the local launcher gives
    its ranks; FSDP2_ALLOCATOR=system silences it."""
    plain = _setup_stderr()
    assert "start it with LD_PRELOAD=" in plain and "libtcmalloc" in plain, plain
    assert "LD_PRELOAD" not in _setup_stderr(FSDP2_ALLOCATOR="system")


def test_an_outside_rank_restarts_with_the_rank_environment(tmp_path):
    """restart_with_rank_environment() first thing in a rank an outside
    launcher started runs the program again, once, with tcmalloc and the rest
    of what launch_local gives its ranks; setup_environment() then has
    nothing to warn about. A process that has it all does not restart."""
    def run(runs, **changes):
        r = _outside_rank("restart_then_setup", runs, **changes)
        return r, runs.read_text().count("run")

    r, runs = run(tmp_path / "bare")
    assert runs == 2, r.stdout + r.stderr
    assert "allocator tcmalloc" in r.stdout and "wait PASSIVE" in r.stdout, r.stdout
    assert "warning" not in r.stderr, r.stderr
    r, runs = run(tmp_path / "complete", FSDP2_ALLOCATOR="system", OMP_WAIT_POLICY="ACTIVE")
    assert runs == 1, r.stdout + r.stderr
    assert "allocator system" in r.stdout and "wait ACTIVE" in r.stdout, r.stdout


def test_unshard_and_reshard_by_module_name(tmp_path):
    """Explicit unshard (with its handle) and reshard in this process: a
    world of one in bf16, where an unsharded block holds a bf16 copy."""
    os.environ["FSDP2_STORE_PATH"] = str(tmp_path / "store")
    try:
        with fsdp2.FSDP2Strategy(precision="bf16", device="cpu") as s:
            s.setup_environment()
            with pytest.raises(fsdp2.WrongOrderError, match="parallelize"):
                s.unshard("blocks.0")
            with fsdp2.Model.gpt(**GPT) as model:
                s.connect(model)
            s.parallelize()
            assert s.memory_stats()["unsharded_param_bytes"] == 0
            handle = s.unshard("blocks.0", async_op=True)
            assert isinstance(handle, fsdp2.UnshardHandle)
            handle.wait()
            assert handle.closed
            with pytest.raises(fsdp2.InvalidHandleError, match="closed"):
                handle.wait()
            assert s.memory_stats()["unsharded_param_bytes"] > 0
            s.reshard("blocks.0")
            assert s.memory_stats()["unsharded_param_bytes"] == 0
            with s.unshard("", async_op=True):
                pass  # closed without waiting: reshard completes it
            s.reshard("")
            assert s.memory_stats()["unsharded_param_bytes"] == 0
            with pytest.raises(fsdp2.InvalidArgumentError,
                               match="'blocks.5', which is not a module of the model"):
                s.unshard("blocks.5")
            with pytest.raises(fsdp2.InvalidArgumentError, match="not a sharded module"):
                s.reshard("blocks.0.attn")
    finally:
        del os.environ["FSDP2_STORE_PATH"]


def test_explicit_unshard_changes_no_bit_of_training():
    plain = launch(2, "train", 4, "-")
    gathered = launch(2, "train", 4, "-", "none", 0.0, "unshard")
    for key in plain:
        np.testing.assert_array_equal(gathered[key], plain[key], err_msg=key)


def test_two_ranks_equal_one_rank():
    one = launch(1, "train", 4, "-")
    two = launch(2, "train", 4, "-")
    assert one["losses"][-1] < one["losses"][0]
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    # fp32 parameters after 4 AdamW steps: Adam divides by sqrt(v), so the
    # last bits of tiny gradients (summed in another order) show up to ~1e-5
    # absolute in near-zero biases; a wrong reduction shows up at ~lr = 1e-2.
    for key in one:
        np.testing.assert_allclose(two[key], one[key], rtol=1e-4, atol=1e-4, err_msg=key)


def memory_run(world, **options):
    """Each rank's memory_stats() dicts of the "memory" scenario."""
    out = os.path.join(_tmp(), f"memory_{world}_{len(os.listdir(_tmp()))}.npz")
    launch_to(out, world, "memory", json.dumps(options))
    ranks = []
    for r in range(world):
        with open(f"{out}.{r}.json") as f:
            ranks.append(json.load(f))
    return ranks


@pytest.mark.parametrize("world", [1, 2])
def test_memory_stats_full_shard(world):
    ranks = memory_run(world)
    total = ranks[0]["global_bytes"]
    for rank in ranks:
        built, trained, reset = rank["built"], rank["trained"], rank["reset"]
        for stats in (built, trained, reset):
            assert tuple(stats) == fsdp2.MEMORY_STATS
            assert stats["total_param_bytes"] == total
            assert stats["peak_rss_bytes"] >= stats["rss_bytes"] > 0
        assert built["optimizer_state_bytes"] == 0 and built["sharded_grad_bytes"] == 0
        # AdamW keeps two moments per element of this rank's shards.
        assert trained["optimizer_state_bytes"] == 2 * trained["sharded_param_bytes"]
        # The step zeroes the gradients by freeing them (they count as zero).
        assert trained["sharded_grad_bytes"] == 0
        if world == 1:
            # One rank holds everything and never gathers.
            assert trained["sharded_param_bytes"] == total
            assert trained["peak_unsharded_param_bytes"] == 0
        else:
            assert 0 < trained["peak_unsharded_param_bytes"] <= total
            assert reset["peak_unsharded_param_bytes"] < trained["peak_unsharded_param_bytes"]
        assert reset["peak_unsharded_param_bytes"] == reset["unsharded_param_bytes"]
        # The RSS peak restarts from the RSS at the reset, which may have grown
        # a little since `trained` was read (CI measured 8 KiB).
        assert reset["peak_rss_bytes"] <= trained["peak_rss_bytes"] + (1 << 20)
        assert reset["peak_rss_bytes"] >= reset["rss_bytes"]
    # FULL_SHARD splits every parameter's rows over the ranks: the shards add
    # up to the model, about half of it on each of 2 ranks.
    assert sum(r["trained"]["sharded_param_bytes"] for r in ranks) == total
    for r in ranks:
        assert abs(r["trained"]["sharded_param_bytes"] - total / world) <= 0.1 * total / world


@pytest.mark.parametrize("world", [1, 2])
def test_memory_stats_bf16_computes_with_bf16_copies(world):
    """Under bf16 mixed precision the shards (fp32 masters) and AdamW's state
    keep their size; the full-size copies units compute with are bf16, also
    on one rank, where they are casts rather than gathers."""
    for rank in memory_run(world, precision="bf16"):
        trained, total = rank["trained"], rank["global_bytes"]
        assert trained["total_param_bytes"] == total
        assert trained["sharded_param_bytes"] * world == total
        assert trained["optimizer_state_bytes"] == 2 * trained["sharded_param_bytes"]
        assert 0 < trained["peak_unsharded_param_bytes"] <= total // 2


def test_memory_stats_no_shard_keeps_the_model_on_each_rank():
    for rank in memory_run(2, sharding_strategy="no_shard"):
        trained = rank["trained"]
        assert trained["sharded_param_bytes"] == trained["total_param_bytes"] == rank["global_bytes"]
        assert trained["optimizer_state_bytes"] == 2 * rank["global_bytes"]
        assert trained["peak_unsharded_param_bytes"] == 0


def test_activation_checkpointing_options():
    with pytest.raises(fsdp2.InvalidArgumentError, match="none, full, selective"):
        fsdp2.FSDP2Strategy(activation_checkpointing="sometimes")
    with pytest.raises(fsdp2.InvalidArgumentError, match="ac_every must be at least 1"):
        fsdp2.FSDP2Strategy(activation_checkpointing="selective", ac_every=0)
    with pytest.raises(fsdp2.InvalidArgumentError, match="dropout"):
        fsdp2.Model.gpt(**GPT, dropout=1.5)
    fsdp2.FSDP2Strategy(activation_checkpointing=True, ac_every=3).close()


def test_fully_shard_controls_options():
    with pytest.raises(fsdp2.InvalidArgumentError, match="local, sharded"):
        fsdp2.FSDP2Strategy(gradient_accumulation="sometimes")
    with pytest.raises(fsdp2.InvalidArgumentError, match="forward_prefetch and backward_prefetch"):
        fsdp2.FSDP2Strategy(forward_prefetch=-1)
    with pytest.raises(fsdp2.InvalidArgumentError, match="gradient_divide_factor"):
        fsdp2.FSDP2Strategy(gradient_divide_factor=-1.0)
    fsdp2.FSDP2Strategy(forward_prefetch=0, backward_prefetch=3, gradient_accumulation="sharded",
                        gradient_divide_factor=1.0).close()
    with pytest.raises(fsdp2.InvalidArgumentError, match="must be a list of module names"):
        fsdp2.FSDP2Strategy(forward_prefetch_modules={"blocks.0": "blocks.1"})
    with pytest.raises(fsdp2.InvalidArgumentError, match="contains one of"):
        fsdp2.FSDP2Strategy(ignored_params=["a,b"])


def test_ignored_params_and_prefetch_lists_by_name(tmp_path):
    """The options reach parallelize(): names the model has train, a pattern
    that matches nothing and a list in the wrong order are refused there."""
    os.environ["FSDP2_STORE_PATH"] = str(tmp_path / "store")
    try:
        tokens, targets = global_batch(0)
        good = dict(ignored_params=["wpe.weight", "blocks.1.*"], ignored_params_all_reduce=True,
                    forward_prefetch_modules={"": ["blocks.1", "blocks.0"]},
                    backward_prefetch_modules={"blocks.1": ["blocks.0"]})
        bad = [(dict(ignored_params=["nothing.*"]), "'nothing.\\*' matches no parameter"),
               (dict(forward_prefetch_modules={"blocks.1": ["blocks.0"]}),
                "the forward reaches before it")]
        for i, (options, error) in enumerate([(good, None)] + bad):
            os.environ["FSDP2_STORE_PATH"] = str(tmp_path / f"store{i}")
            with fsdp2.FSDP2Strategy(precision="fp32", **options) as s:
                s.setup_environment()
                model = fsdp2.Model.gpt(**GPT)
                s.connect(model, {"lr": 0.01})
                if error:
                    with pytest.raises(fsdp2.InvalidArgumentError, match=error):
                        s.parallelize()
                    continue
                s.parallelize()
                assert math.isfinite(s.training_step([tokens, targets], 0).loss)
    finally:
        del os.environ["FSDP2_STORE_PATH"]


def test_activation_checkpointing_changes_nothing():
    """Recomputing every block in backward (dropout masks replayed) gives
    the same losses and parameters, bit for bit, on 1 and 2 ranks."""
    for world in (1, 2):
        plain = launch(world, "train", 3, "-", "none", 0.1)
        ac = launch(world, "train", 3, "-", "full", 0.1)
        assert plain.keys() == ac.keys()
        for key in plain:
            np.testing.assert_array_equal(ac[key], plain[key], err_msg=f"{key} on {world} ranks")
    selective = launch(2, "train", 3, "-", "selective", 0.1)
    np.testing.assert_array_equal(selective["losses"], plain["losses"])
    # Dropout is on: without it the losses differ.
    assert not np.array_equal(launch(1, "train", 3, "-", "none", 0.0)["losses"],
                              launch(1, "train", 3, "-", "none", 0.1)["losses"])


def test_activation_checkpointing_lowers_the_peak():
    """Equal losses would hold were the option ignored: with every block
    checkpointed, a step's resident memory grows by well under half of what
    it grows without (the activations of all blocks alive at the end of
    forward against their inputs and one block's recomputation; measured:
    about 4x less)."""
    # Freed tensors leave resident memory at once (glibc's adaptive mmap
    # threshold would keep them in its heap).
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    try:
        none = int(launch(1, "ac_memory", "none")["growth"][0])
        full = int(launch(1, "ac_memory", "full")["growth"][0])
    finally:
        del os.environ["MALLOC_MMAP_THRESHOLD_"]
    print(f"a step grows the resident memory by {none / 2**20:.1f} MiB without activation "
          f"checkpointing, {full / 2**20:.1f} MiB with")
    assert none > 32 << 20
    assert full < none // 2, (full, none)


def test_checkpoint_from_two_ranks_resumes_on_one():
    full = launch(1, "train", 5, "-")
    ckpt = os.path.join(_tmp(), "py_ckpt")
    launch(2, "train", 3, ckpt)
    resumed = launch(1, "resume", ckpt, 5)
    np.testing.assert_allclose(resumed["losses"], full["losses"][3:], rtol=1e-5)


def restart_rank(out, kill_after):
    """A rank of a job launched with restarts: 4 steps, a checkpoint after
    every 2; on a restart it resumes from the checkpoint. In the first run
    rank 1 kills itself after step `kill_after` (0: never)."""
    import signal
    ckpt = os.path.join(out, "ckpt")
    with new_strategy() as s:
        start = 0
        if fsdp2.restart_count() > 0 and os.path.exists(os.path.join(ckpt, "metadata.json")):
            s.load_checkpoint(ckpt)
            start = s.current_epoch_step[1]
        losses = []
        for i in range(start, 4):
            losses.append(float(s.training_step(local_rows(s, i), i)))
            if (i + 1) % 2 == 0:
                s.save_checkpoint(ckpt)
            if s.rank == 1 and i + 1 == kill_after and fsdp2.restart_count() == 0:
                os.kill(os.getpid(), signal.SIGKILL)
        if s.rank == 0:
            with open(os.path.join(out, "run%d.json" % fsdp2.restart_count()), "w") as f:
                json.dump({"start": start, "losses": losses}, f)


def test_launch_local_restarts_after_a_rank_dies(tmp_path):
    # The same job, uninterrupted and with rank 1 killed after step 3: the
    # restarted run resumes at step 2 with the uninterrupted losses; without
    # restarts the job fails.
    def job(out, max_restarts, kill_after):
        os.makedirs(out)
        code = subprocess.run(
            [sys.executable, __file__, "--restart-job", str(out), str(max_restarts),
             str(kill_after)], timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1")).returncode
        return code
    assert job(tmp_path / "plain", 0, 0) == 0
    with open(tmp_path / "plain" / "run0.json") as f:
        want = json.load(f)["losses"]
    assert job(tmp_path / "killed", 1, 3) == 0
    with open(tmp_path / "killed" / "run1.json") as f:
        run = json.load(f)
    assert run["start"] == 2 and not (tmp_path / "killed" / "run0.json").exists()
    np.testing.assert_allclose(run["losses"], want[2:], rtol=1e-6)
    assert job(tmp_path / "no_restarts", 0, 3) != 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--restart-job":
        sys.exit(fsdp2.launch_local(2, argv=[__file__, "--restart-rank", sys.argv[2], sys.argv[4]],
                                    threads_per_rank=1, max_restarts=int(sys.argv[3])))
    if len(sys.argv) > 1 and sys.argv[1] == "--restart-rank":
        restart_rank(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], *sys.argv[4:])
        sys.exit(0)
    sys.exit(pytest.main([__file__, "-v", "-p", "no:cacheprovider"]))
