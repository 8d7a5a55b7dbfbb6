"""pytest tests: a Hugging Face checkpoint fine-tuned from Python
(Model.from_hf, frozen_params, FSDP2Strategy.save_hf), against transformers.

tests/hf/hf_reference.py makes the tiny random Llama (nine shards) and Qwen2
(tied embeddings) checkpoints and transformers' logits and AdamW losses, in
a process of its own (torch and fsdp2 never share a process). fsdp2 trains
each on 2 ranks (this file started again as workers), built inside
tensor_init_context(), and must give transformers' logits and losses; what
it saves must load in transformers with fsdp2's trained logits.
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
HF_REFERENCE = os.path.join(ROOT, "tests", "hf", "hf_reference.py")
sys.path.insert(0, os.path.join(ROOT, "core", "checkpoint"))
from load_safetensors import load_safetensors  # noqa: E402

FROZEN = "model.embed_tokens.*,model.layers.0.*,*norm*"  # as hf_reference.py


def _tmp():
    return os.environ.get("TEST_TMPDIR") or tempfile.gettempdir()


@pytest.fixture(scope="module")
def made():
    out = tempfile.mkdtemp(prefix="hf_", dir=_tmp())
    subprocess.run([sys.executable, HF_REFERENCE, "prepare", out], check=True, timeout=600,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    return out


def worker(out, spec_json):
    spec = json.loads(spec_json)
    data, _ = load_safetensors(spec["data"])
    options = dict(precision="fp32", seed=1)
    if spec["frozen"]:
        options["frozen_params"] = spec["frozen"]
    with fsdp2.FSDP2Strategy(**options) as s:
        s.setup_environment()
        with s.tensor_init_context():
            model = fsdp2.Model.from_hf(spec["checkpoint"])
        s.connect(model, fsdp2.Optimizer(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8,
                                         weight_decay=0.1))
        s.parallelize()
        rank, world = s.data_parallel_rank, s.data_parallel_size
        logits = s.predict_step([data["eval"]])
        losses = []
        for step in range(data["inputs"].shape[0]):
            rows = data["inputs"].shape[1] // world
            batch = [data[k][step][rank * rows:(rank + 1) * rows] for k in ("inputs", "targets")]
            losses.append(float(s.training_step(batch, step)))
        after = s.predict_step([data["eval"]])
        if spec["save"]:
            s.save_hf(spec["save"], max_shard_size=spec["shard_size"])
        model.close()
        if s.rank == 0:
            np.save(out + ".logits.npy", logits)
            np.save(out + ".after.npy", after)
            with open(out + ".json", "w") as f:
                json.dump({"losses": losses, "world": s.world_size}, f)


def launch(world, spec, timeout=240):
    out = os.path.join(_tmp(), f"hf_{world}_{len(os.listdir(_tmp()))}")
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                   FSDP2_STORE_PATH=out + ".store", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", out, json.dumps(spec)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for p in procs:
        try:
            log = p.communicate(timeout=timeout)[0].decode()
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{world} ranks timed out after {timeout} s")
        assert p.returncode == 0, f"a rank failed:\n{log}"
    with open(out + ".json") as f:
        result = json.load(f)
    result["logits"] = np.load(out + ".logits.npy")
    result["after"] = np.load(out + ".after.npy")
    return result


def reference(made, name):
    ref, _ = load_safetensors(os.path.join(made, name + ".ref.safetensors"))
    return ref


def rel(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


@pytest.mark.parametrize("name,frozen", [("llama", False), ("qwen2", True)])
def test_from_hf_trains_like_transformers(made, name, frozen):
    spec = dict(checkpoint=os.path.join(made, name), data=os.path.join(made, "data.safetensors"),
                frozen=FROZEN if frozen else "", save="", shard_size="5GB")
    got = launch(2, spec)
    want = reference(made, name + (".frozen" if frozen else ""))
    assert rel(got["logits"], want["logits"]) <= 1e-5
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)
    assert rel(got["after"], want["after"]) <= 1e-4


def test_save_hf_loads_in_transformers(made):
    saved = os.path.join(made, "py_saved")
    spec = dict(checkpoint=os.path.join(made, "llama"), data=os.path.join(made, "data.safetensors"),
                frozen="", save=saved, shard_size="40KB")
    got = launch(2, spec)
    assert os.path.exists(os.path.join(saved, "model.safetensors.index.json"))
    subprocess.run([sys.executable, HF_REFERENCE, "check", os.path.join(made, "data.safetensors"),
                    saved], check=True, timeout=300)
    theirs, _ = load_safetensors(saved + ".logits.safetensors")
    assert rel(got["after"], theirs["logits"]) <= 1e-5


def test_bad_checkpoints_raise_with_the_librarys_message(made, tmp_path):
    with pytest.raises(fsdp2.InvalidArgumentError, match="needs \"path\""):
        fsdp2.Model.from_config({"family": "hf"})
    with pytest.raises(fsdp2.Error, match="has no config.json"):
        fsdp2.Model.from_hf(str(tmp_path))
    with pytest.raises(fsdp2.InvalidArgumentError, match="dtype"):
        fsdp2.Model.from_hf(os.path.join(made, "llama"), dtype="int8")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        sys.exit(pytest.main([__file__, "-v"]))
