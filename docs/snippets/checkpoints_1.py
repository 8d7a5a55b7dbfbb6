# generated from docs/checkpoints.md by docs/snippets/extract.py; edit the page, not this file
import os
import numpy as np
import fsdp2

def new_strategy():  # the same model and seed every time; sharded is the default format
    s = fsdp2.FSDP2Strategy(precision="fp32", seed=7)
    s.setup_environment()
    with fsdp2.Model.gpt(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32) as model:
        s.connect(model, fsdp2.Optimizer(lr=1e-2))
    s.parallelize()
    return s

with new_strategy() as s:
    for step in range(2):
        seq = np.random.default_rng([step, s.data_parallel_rank]).integers(0, 64, size=(4, 17))
        assert np.isfinite(s.training_step([seq[:, :-1], seq[:, 1:]], step).loss)
    s.save_checkpoint("ckpt")
    saved = s.lightning_module_state_dict()  # collective: full parameters by name

# A second strategy in this process joins the job again: through a file store in the
# shared working directory, since rank 0's first store may still be closing.
os.environ["FSDP2_STORE_PATH"] = os.path.abspath("store")
with new_strategy() as s:
    s.load_checkpoint("ckpt")
    assert s.current_epoch_step[1] == 2
    loaded = s.lightning_module_state_dict()
assert sorted(os.listdir("ckpt")) == ["metadata.json", "rank0-of-2.safetensors",
                                      "rank1-of-2.safetensors"]
for name, value in saved.items():
    np.testing.assert_array_equal(loaded[name], value, err_msg=name)
