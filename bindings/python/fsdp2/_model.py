"""Model: the models a strategy trains (GPT, MLP, Hugging Face, TorchScript)."""

import json
import os
import threading

from . import fsdp2_c as _c
from ._handle import _Handle


class Model(_Handle):
    """A model the strategy can train. Build with Model.gpt(), Model.mlp()
    or Model.from_torchscript(); see fsdp2.h for each family's batch."""

    _destroy = staticmethod(_c.fsdp2_model_destroy)

    @classmethod
    def from_config(cls, config):
        """`config`: a dict or JSON text with "family" and sizes. Inside a
        strategy's tensor_init_context() the model is built deferred."""
        text = config if isinstance(config, str) else json.dumps(config)
        deferred = getattr(_init_context, "strategy", None)
        if deferred is not None:
            return cls(_c.fsdp2_model_create_deferred(deferred.handle, text))
        return cls(_c.fsdp2_model_create(text))

    @classmethod
    def gpt(cls, **sizes):
        """GPT-style decoder: vocab_size, block_size, n_layer, n_head, n_embd,
        dropout (default 0). Batch: [tokens [B,T] int, targets [B,T] int]."""
        return cls.from_config(dict(family="gpt", **sizes))

    @classmethod
    def mlp(cls, **sizes):
        """Residual MLP: in_features, hidden, out_features, depth. Batch:
        [x [B,in] float, y [B,out] float (MSE) or [B] int (cross-entropy)]."""
        return cls.from_config(dict(family="mlp", **sizes))

    @classmethod
    def from_hf(cls, path, dtype=None, lora_rank=0, lora_alpha=8.0, lora_dropout=0.0,
                lora_target_modules=None):
        """A Hugging Face Llama, Mistral or Qwen2 checkpoint directory
        (config.json and model.safetensors, or shards with
        model.safetensors.index.json, as save_pretrained writes them). The
        weights load in parallelize(), each rank reading only its rows;
        inside tensor_init_context() no rank ever holds the whole model.
        Parameters are float32 unless `dtype` ("bfloat16", "float16",
        "float64") says otherwise. Batch and predictions as for gpt(); a
        batch may also be [tokens, targets, segments] with -100 targets
        (not learned) and packed documents, as TokenDataLoader reads a
        dataset of fsdp2.prepare_data; save with FSDP2Strategy.save_hf().

        lora_rank > 0 trains LoRA adapters (PEFT's r, lora_alpha,
        lora_dropout, lora_target_modules: "q_proj,v_proj" or a list of
        q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)
        and freezes every other weight."""
        config = {"family": "hf", "path": os.fspath(path)}
        if dtype is not None:
            config["dtype"] = dtype
        if lora_rank:
            config.update(lora_rank=int(lora_rank), lora_alpha=float(lora_alpha),
                          lora_dropout=float(lora_dropout))
            if lora_target_modules is not None:
                config["lora_target_modules"] = (
                    lora_target_modules if isinstance(lora_target_modules, str)
                    else list(lora_target_modules))
        return cls.from_config(config)

    @classmethod
    def from_torchscript(cls, path, loss="mse", auto_wrap=None):
        """A TorchScript file (torch.jit.save), trained block by block.

        loss: "mse" or "cross_entropy" (every batch array but the last goes
        to the script's forward, the last is the target), or "model" (every
        array goes to forward, which returns the loss).
        auto_wrap: None (every child of every nn.ModuleList becomes its own
        FSDP unit), or a list of submodule paths and class names ("Block",
        "blocks.3"); [] keeps the whole script as one unit. See
        fsdp2_model_load_torchscript_with_options in fsdp2.h."""
        options = {"loss": loss}
        if auto_wrap is not None:
            if isinstance(auto_wrap, str):
                raise TypeError("auto_wrap must be a list of paths and class names, "
                                "not a string")
            options["auto_wrap"] = list(auto_wrap)
        return cls(_c.fsdp2_model_load_torchscript_with_options(
            os.fspath(path), json.dumps(options)))

    def num_parameters(self):
        """(parameter tensors, elements), global sizes."""
        return tuple(_c.fsdp2_model_num_parameters(self.handle))


_init_context = threading.local()
