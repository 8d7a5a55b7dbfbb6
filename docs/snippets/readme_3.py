# generated from README.md by docs/snippets/extract.py; edit the page, not this file
import numpy as np
import fsdp2

with fsdp2.FSDP2Strategy(sharding_strategy="full_shard", precision="fp32") as s:
    s.setup_environment()                      # torchrun/srun/mpirun, or alone
    with fsdp2.Model.gpt(vocab_size=64, block_size=16, n_layer=2, n_head=2,
                         n_embd=32) as model:
        s.connect(model, fsdp2.Optimizer(lr=1e-2))
    s.parallelize()
    seq = np.arange(4 * 17).reshape(4, 17) * 3 % 64   # this rank's rows
    batch = [seq[:, :-1], seq[:, 1:]]                 # tokens, targets
    losses = [s.training_step(batch, batch_idx=i, gradient_clip_val=1.0)
              for i in range(20)]
    s.save_checkpoint("ckpt")
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert losses[-1] < losses[0]
