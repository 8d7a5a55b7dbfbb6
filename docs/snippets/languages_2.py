# generated from docs/languages.md by docs/snippets/extract.py; edit the page, not this file
import os
import numpy as np
import fsdp2

with fsdp2.FSDP2Strategy(precision="fp32") as s:
    s.setup_environment()                  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    with fsdp2.Model.gpt(vocab_size=64, block_size=16, n_layer=2, n_head=2,
                         n_embd=32) as model:
        s.connect(model, fsdp2.Optimizer(lr=3e-3))
    s.parallelize()
    rng = np.random.default_rng(s.rank)    # this rank's rows

    def batch():
        seq = rng.integers(0, 64, size=(4, 17), dtype=np.int64)
        return [seq[:, :-1], seq[:, 1:]]   # tokens and next tokens

    for step in range(3):
        result = s.training_step(batch(), batch_idx=step, gradient_clip_val=1.0)
        assert np.isfinite(result.loss), result
    saved = s.lightning_module_state_dict()  # full parameters by name
    s.save_checkpoint("ckpt")              # a relative directory
    assert os.path.isfile("ckpt/metadata.json")
    s.training_step(batch(), batch_idx=3)  # move away from the checkpoint
    s.load_checkpoint("ckpt")
    loaded = s.lightning_module_state_dict()
    assert all(np.array_equal(saved[name], loaded[name]) for name in saved)
    assert s.current_epoch_step[1] == 3
