# generated from docs/tensor-parallel.md by docs/snippets/extract.py; edit the page, not this file
import numpy as np
import fsdp2

# 2 ranks, (dp, tp) = (1, 2): both ranks hold half of each split layer and take the same rows.
with fsdp2.FSDP2Strategy(tensor_parallel_size=2, precision="fp32", seed=3) as s:
    s.setup_environment()
    assert (s.world_size, s.data_parallel_size) == (2, 1)
    with fsdp2.Model.gpt(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32) as model:
        s.connect(model, fsdp2.Optimizer(lr=1e-2))
    s.parallelize()
    for step in range(3):
        rng = np.random.default_rng([step, s.data_parallel_rank])  # rows by data-parallel rank
        seq = rng.integers(0, 64, size=(4, 17))
        result = s.training_step([seq[:, :-1], seq[:, 1:]], step, gradient_clip_val=1.0)
        assert np.isfinite(result.loss) and np.isfinite(result.grad_norm)
    state = s.lightning_module_state_dict()  # collective: gathered over dp and tp
    assert state["blocks.0.attn.qkv.weight"].shape == (96, 32)  # 3 x n_embd rows, not 48
    assert state["blocks.0.fc_proj.weight"].shape == (32, 128)  # 4 x n_embd columns, not 64
    if s.rank == 0:
        print("loss", result.loss, "qkv", state["blocks.0.attn.qkv.weight"].shape)
