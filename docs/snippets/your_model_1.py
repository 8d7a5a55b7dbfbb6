# generated from docs/your-model.md by docs/snippets/extract.py; edit the page, not this file
import json, os, struct
import numpy as np, fsdp2

CONFIG = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=64, hidden_size=16,
              intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
LAYER = {"self_attn.q_proj": (16, 16), "self_attn.k_proj": (8, 16), "self_attn.v_proj": (8, 16),
         "self_attn.o_proj": (16, 16), "mlp.gate_proj": (32, 16), "mlp.up_proj": (32, 16),
         "mlp.down_proj": (16, 32), "input_layernorm": (16,), "post_attention_layernorm": (16,)}
SHAPES = {"model.embed_tokens.weight": (64, 16), "model.norm.weight": (16,), "lm_head.weight": (64, 16),
          **{f"model.layers.{i}.{k}.weight": v for i in range(2) for k, v in LAYER.items()}}
rng = np.random.default_rng(0)  # the same weights on every rank: norms 1, the rest N(0, 0.02)
W = {k: (np.ones(s) if len(s) == 1 else 0.02 * rng.standard_normal(s)).astype(np.float32)
     for k, s in SHAPES.items()}

def write_hf(path):  # config.json + model.safetensors, as save_pretrained writes them
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for k, v in W.items():
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [offset, offset + v.nbytes]}
        offset += v.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(path)
    with open(f"{path}/config.json", "w") as c, open(f"{path}/model.safetensors", "wb") as f:
        json.dump(CONFIG, c)
        f.write(struct.pack("<Q", len(text)) + text + b"".join(v.tobytes() for v in W.values()))

with fsdp2.FSDP2Strategy(precision="fp32", seed=1, frozen_params=["model.embed_tokens.*"]) as s:
    s.setup_environment()
    if s.rank == 0: write_hf("tiny-llama")
    s.barrier()  # the files are there before any rank reads config.json
    with s.tensor_init_context(), fsdp2.Model.from_hf("tiny-llama") as model:  # deferred: no memory yet
        s.connect(model, fsdp2.Optimizer(lr=1e-2))
    s.parallelize()  # shards, then each rank reads its rows of model.safetensors
    for step in range(2):
        seq = np.random.default_rng([step, s.data_parallel_rank]).integers(0, 64, size=(2, 17))
        assert np.isfinite(s.training_step([seq[:, :-1], seq[:, 1:]], step).loss)
    for name, frozen in [("model.embed_tokens.weight", True), ("model.layers.0.mlp.down_proj.weight", False)]:
        assert np.array_equal(s.get_parameter(name), W[name]) == frozen, name  # collective
    s.save_hf("tuned")  # AutoModelForCausalLM.from_pretrained("tuned") loads it
    assert s.rank != 0 or sorted(os.listdir("tuned")) == [
        "config.json", "generation_config.json", "model.safetensors"]
