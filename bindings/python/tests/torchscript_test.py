"""pytest tests: your own PyTorch model, scripted with torch.jit.script and
saved, trained by fsdp2 from Python (Model.from_torchscript), block by block.

The models and PyTorch's own training of them come from
tests/script/script_models.py, run with the venv's PyTorch 2.11
in a process of its own (torch and fsdp2 never share a
process). fsdp2 trains the saved file on N = 1..4 ranks, each rank on its
rows r*12/N... of PyTorch's global batch, with PyTorch's AdamW
hyper-parameters, and must print PyTorch's losses. Ranks are this file
started again as worker processes (RANK, WORLD_SIZE, FSDP2_STORE_PATH: a
FileStore), each launch with a timeout; one launch trains a list of runs in
sequence, each run in a world of its own.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import fsdp2

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
SCRIPT_MODELS = os.path.join(ROOT, "tests", "script", "script_models.py")
sys.path.insert(0, os.path.join(ROOT, "core", "checkpoint"))
from load_safetensors import load_safetensors  # noqa: E402

TORCH_PYTHON = sys.executable  # the venv's, with PyTorch 2.11
STEPS = 4
RTOL = 1e-5
MODELS = ("gpt", "masked", "self_loss", "moe")


def _tmp():
    return os.environ.get("TEST_TMPDIR") or tempfile.gettempdir()


# ---------------------------------------------------------------------------
# The saved models and PyTorch's losses (made once per test session)


@pytest.fixture(scope="module")
def made():
    """{model name: its directory (model.pt, batches.safetensors, reference.json)}."""
    base = tempfile.mkdtemp(prefix="script_models_", dir=_tmp())
    dirs = {}
    for name in MODELS:
        dirs[name] = os.path.join(base, name)
        subprocess.run([TORCH_PYTHON, SCRIPT_MODELS, "make", name, dirs[name], str(STEPS)],
                       check=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return dirs


def reference(model_dir):
    with open(os.path.join(model_dir, "reference.json")) as f:
        return json.load(f)


def run(model_dir, options=None, auto_wrap=None, steps=STEPS, save=None, predict=False):
    """One training run of a worker: the model in `model_dir` under the
    strategy `options`, optionally saving a full checkpoint to `save` and
    predicting on step 0's inputs. Every run reports its parameters' names
    and shapes and its memory_stats() after the last step."""
    return dict(dir=str(model_dir), options=options or {}, auto_wrap=auto_wrap, steps=steps,
                save=save, predict=predict)


# ---------------------------------------------------------------------------
# Worker side


def local_rows(arrays, rank, world):
    rows = arrays[0].shape[0] // world
    return [a[rank * rows:(rank + 1) * rows] for a in arrays]


def train_one(spec, store):
    """Trains one run in a world of its own (rendezvous at `store`);
    returns its losses (and, on request, its prediction)."""
    os.environ["FSDP2_STORE_PATH"] = store
    ref = reference(spec["dir"])
    batches, _ = load_safetensors(os.path.join(spec["dir"], "batches.safetensors"))
    adamw = ref["adamw"]
    options = dict(precision="fp32", seed=1, **spec["options"])
    result = {}
    with fsdp2.FSDP2Strategy(**options) as s:
        s.setup_environment()
        with fsdp2.Model.from_torchscript(os.path.join(spec["dir"], "model.pt"), loss=ref["loss"],
                                          auto_wrap=spec["auto_wrap"]) as model:
            s.connect(model, fsdp2.Optimizer(
                lr=adamw["lr"], beta1=adamw["betas"][0], beta2=adamw["betas"][1],
                eps=adamw["eps"], weight_decay=adamw["weight_decay"]))
        s.parallelize()
        rank, world = s.data_parallel_rank, s.data_parallel_size
        losses = []
        for step in range(spec["steps"]):
            batch = [batches[f"s{step}.{i}"] for i in range(ref["tensors"])]
            losses.append(float(s.training_step(local_rows(batch, rank, world), step)))
        result["losses"] = losses
        if spec["save"]:
            s.save_checkpoint(spec["save"])
        if spec["predict"]:
            inputs = [batches[f"s0.{i}"] for i in range(ref["inputs"])]
            result["predict"] = s.predict_step(inputs).tolist()
        infos = s._parameter_infos()
        result["params"] = [[name, [int(d) for d in shape]] for name, _, shape in infos]
        result["memory"] = s.memory_stats()
        result["rank"] = s.rank
    return result


def worker(out, runs_json):
    """Trains each run in turn; rank 0 writes [result of each run] to OUT
    (every rank writes OUT.<rank> for the memory runs)."""
    runs = json.loads(runs_json)
    base = os.environ["FSDP2_STORE_PATH"]
    results = [train_one(spec, f"{base}.{i}") for i, spec in enumerate(runs)]
    rank = results[0]["rank"] if results else 0
    with open(f"{out}.{rank}", "w") as f:
        json.dump(results, f)


def launch(world, runs, timeout=240):
    """Runs `world` ranks through `runs`; returns each rank's results."""
    out = os.path.join(_tmp(), f"script_{world}_{len(os.listdir(_tmp()))}.json")
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                   FSDP2_STORE_PATH=out + ".store", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--worker", out, json.dumps(runs)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0].decode())
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{len(runs)} runs on {world} ranks timed out after {timeout} s")
    for p, log in zip(procs, logs):
        assert p.returncode == 0, f"a rank of {world} failed:\n{log}"
    ranks = []
    for r in range(world):
        with open(f"{out}.{r}") as f:
            ranks.append(json.load(f))
    return ranks


def check_losses(got, model_dir, what):
    want = reference(model_dir)["losses"]
    np.testing.assert_allclose(got, want, rtol=RTOL, err_msg=f"{what}: PyTorch's losses")


# ---------------------------------------------------------------------------
# Equivalence with PyTorch


# N = 2 also trains SHARD_GRAD_OP, NO_SHARD and HYBRID_SHARD (2 replicas of
# a 1-rank shard group), and the default wrapping again named by class and
# by path, all in the same launch.
STRATEGIES_ON_TWO = [
    {"sharding_strategy": "shard_grad_op"},
    {"sharding_strategy": "no_shard"},
    {"sharding_strategy": "hybrid_shard", "shard_group_size": 1},
]
WRAPS = {"gpt": [["Block"], ["blocks.0", "blocks.1", "blocks.2"], []],
         "masked": [["Residual"]], "self_loss": [["Residual"]]}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_scripted_models_train_to_pytorchs_losses(made, world):
    """gpt, masked (two inputs) and self_loss (the model returns its loss):
    FULL_SHARD on `world` ranks (and the other strategies and wrappings on
    2) equal PyTorch's losses."""
    names = ("gpt", "masked", "self_loss")
    runs, what = [], []
    for name in names:
        runs.append(run(made[name]))
        what.append((name, "full_shard"))
        if world == 2:
            for options in STRATEGIES_ON_TWO:
                runs.append(run(made[name], options))
                what.append((name, options["sharding_strategy"]))
            for wrap in WRAPS[name]:
                runs.append(run(made[name], auto_wrap=wrap))
                what.append((name, f"full_shard, auto_wrap={wrap}"))
    ranks = launch(world, runs)
    for rank in ranks:
        for result, (name, how) in zip(rank, what):
            check_losses(result["losses"], made[name], f"{name} {how} on {world} ranks")
            # The strategy took effect: FULL_SHARD and SHARD_GRAD_OP split the
            # parameters over the ranks; NO_SHARD and 1-rank shard groups
            # keep all of them on every rank.
            stats = result["memory"]
            whole = world == 1 or how.startswith(("no_shard", "hybrid_shard"))
            assert (stats["sharded_param_bytes"] == stats["total_param_bytes"]) == whole, \
                (name, how, stats)


# Units that run on only some ranks (issue #13): every rank issues the same
# collectives in tree order whatever experts it calls; a collective that
# nobody else joined would end in the 20 s timeout below.
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_experts_skipped_on_some_ranks_train_to_pytorchs_losses(made, world):
    """moe: each rank calls only the experts its rows route to (some rank
    never calls expert 2 or 3; at step 2 no rank calls expert 3)."""
    quick = {"timeout_ms": 20000}  # a collective nobody else joins fails in 20 s
    runs = [run(made["moe"], quick)]
    if world == 2:
        runs += [run(made["moe"], dict(quick, **options)) for options in STRATEGIES_ON_TWO]
    for rank in launch(world, runs, timeout=150):
        for result, spec in zip(rank, runs):
            check_losses(result["losses"], made["moe"],
                         f"moe {spec['options'] or 'full_shard'} on {world} ranks")


# ---------------------------------------------------------------------------
# Errors, in this process (a world of one)


@pytest.fixture
def one_rank(tmp_path):
    os.environ["FSDP2_STORE_PATH"] = str(tmp_path / "store")
    yield
    del os.environ["FSDP2_STORE_PATH"]


def connected(model):
    s = fsdp2.FSDP2Strategy(precision="fp32")
    s.setup_environment()
    s.connect(model, fsdp2.Optimizer(lr=0.01))
    model.close()
    s.parallelize()
    return s


def test_a_bad_auto_wrap_entry_names_the_scripts_classes(made):
    path = os.path.join(made["gpt"], "model.pt")
    with pytest.raises(fsdp2.InvalidArgumentError) as e:
        fsdp2.Model.from_torchscript(path, loss="cross_entropy", auto_wrap=["Blok"])
    message = str(e.value)
    # The classes (and ModuleLists) the script has, the root excepted.
    for text in ('"Blok"', "Attention, Block", "torch.nn.modules.linear.Linear",
                 "ModuleLists: blocks"):
        assert text in message, message
    with pytest.raises(fsdp2.InvalidArgumentError, match="blocks.7"):
        fsdp2.Model.from_torchscript(path, loss="cross_entropy", auto_wrap=["blocks.7"])
    with pytest.raises(TypeError, match="not a string"):
        fsdp2.Model.from_torchscript(path, auto_wrap="Block")


def test_a_batch_of_the_wrong_arity_names_the_forwards_parameters(made, one_rank):
    batches, _ = load_safetensors(os.path.join(made["masked"], "batches.safetensors"))
    x, mask, y = batches["s0.0"], batches["s0.1"], batches["s0.2"]
    with connected(fsdp2.Model.from_torchscript(os.path.join(made["masked"], "model.pt"))) as s:
        # forward(x, mask): [x, y] gives it x alone.
        with pytest.raises(fsdp2.ShapeError) as e:
            s.training_step([x, y], 0)
        assert "x" in str(e.value) and "mask" in str(e.value), str(e.value)
        with pytest.raises(fsdp2.ShapeError, match="mask"):
            s.training_step([x, mask, mask, y], 0)
        # The right arity trains.
        assert s.training_step([x, mask, y], 0) > 0


def test_loss_model_needs_a_scalar_forward(made, one_rank):
    batches, _ = load_safetensors(os.path.join(made["masked"], "batches.safetensors"))
    model = fsdp2.Model.from_torchscript(os.path.join(made["masked"], "model.pt"), loss="model")
    with connected(model) as s:
        # masked's forward returns [12, 3] predictions, not a loss.
        with pytest.raises(fsdp2.InvalidArgumentError, match="scalar"):
            s.training_step([batches["s0.0"], batches["s0.1"]], 0)


# ---------------------------------------------------------------------------
# A full checkpoint loads into the PyTorch module


CHECK_IN_PYTORCH = r"""
import json, sys, numpy as np, torch
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])
from load_safetensors import load_safetensors
from script_models import GPT
tensors, _ = load_safetensors(sys.argv[3] + "/checkpoint.safetensors")
state = {k: torch.from_numpy(v.copy()) for k, v in tensors.items() if not k.startswith("optim/")}
model = GPT()
# Every name of the PyTorch module's state_dict(), the tied head's too.
model.load_state_dict(state)
assert model.head.weight is model.wte.weight
batches, _ = load_safetensors(sys.argv[4] + "/batches.safetensors")
model.eval()
with torch.no_grad():
    logits = model(torch.from_numpy(batches["s0.0"].copy())).numpy()
json.dump({"keys": sorted(state), "logits": logits.tolist()}, open(sys.argv[5], "w"))
"""


def test_a_full_checkpoint_of_the_scripted_gpt_loads_into_the_pytorch_module(made, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    ranks = launch(2, [run(made["gpt"], {"checkpoint_format": "full"}, save=ckpt,
                           predict=True)])
    result = ranks[0][0]
    check_losses(result["losses"], made["gpt"], "gpt before the checkpoint")
    out = tmp_path / "pytorch.json"
    subprocess.run([TORCH_PYTHON, "-c", CHECK_IN_PYTORCH, os.path.join(ROOT, "core", "checkpoint"),
                    os.path.dirname(SCRIPT_MODELS), ckpt, made["gpt"], str(out)],
                   check=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    with open(out) as f:
        pytorch = json.load(f)
    assert "blocks.2.attn.qkv.weight" in pytorch["keys"] and "head.weight" in pytorch["keys"]
    got, want = np.array(pytorch["logits"]), np.array(result["predict"])
    assert got.shape == want.shape == (12, 16, 64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # Both ranks predict the same from the same inputs.
    np.testing.assert_array_equal(np.array(ranks[1][0]["predict"]), want)


# ---------------------------------------------------------------------------
# Memory


def test_full_shard_gathers_at_most_two_blocks_and_the_root(made):
    """2 ranks, FULL_SHARD, the scripted GPT (3 blocks): the full-size
    parameters alive at once never exceed two blocks (the one computing and
    the one prefetched) plus the root's own parameters."""
    for rank in launch(2, [run(made["gpt"])]):
        result = rank[0]
        check_losses(result["losses"], made["gpt"], "gpt with memory stats")
        sizes = {name: int(np.prod(shape)) * 4 for name, shape in result["params"]}
        block = sum(b for name, b in sizes.items() if name.startswith("blocks.0."))
        # The head's weight is the embedding's tensor (named twice, held once).
        root = sum(b for name, b in sizes.items()
                   if not name.startswith("blocks.")) - sizes["head.weight"]
        total = root + 3 * block
        assert block > 0 and root > 0 and sizes["head.weight"] == sizes["wte.weight"]
        stats = result["memory"]
        assert stats["total_param_bytes"] == total
        peak = stats["peak_unsharded_param_bytes"]
        assert block <= peak <= 2 * block + root, (peak, block, root)
        assert peak < total  # never the whole model at once


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.exit(pytest.main([__file__, "-v", "-p", "no:cacheprovider"]))
