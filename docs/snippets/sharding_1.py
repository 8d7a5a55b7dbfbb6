# generated from docs/sharding.md by docs/snippets/extract.py; edit the page, not this file
import numpy as np
import fsdp2

with fsdp2.FSDP2Strategy(sharding_strategy="full_shard", precision="fp32",
                         reshard_after_forward=False, forward_prefetch=0,
                         backward_prefetch=2, gradient_accumulation="sharded") as s:
    s.setup_environment()                  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    with fsdp2.Model.gpt(vocab_size=64, block_size=16, n_layer=2, n_head=2,
                         n_embd=32) as model:
        s.connect(model, fsdp2.Optimizer(lr=3e-3))
    s.parallelize()
    rng = np.random.default_rng(s.rank)    # this rank's rows
    for step in range(3):
        seq = rng.integers(0, 64, size=(4, 17), dtype=np.int64)
        loss = s.training_step([seq[:, :-1], seq[:, 1:]], batch_idx=step,
                               accumulate_grad_batches=2, gradient_clip_val=1.0)
        assert np.isfinite(loss), loss
    stats = s.memory_stats()
    # Each of the 2 ranks holds its part of the parameters, not all of them.
    assert 0 < stats["sharded_param_bytes"] < stats["total_param_bytes"], stats
