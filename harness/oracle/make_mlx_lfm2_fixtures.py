#!/usr/bin/env python3
"""Writes tiny LFM2 (short conv + GQA attention hybrid) checkpoints *with mlx-lm itself*.

Sibling of make_mlx_fixtures.py and make_mlx_qwen35_fixtures.py (left untouched so their bytes
never move). Same independence argument: the model is mlx-lm's own class (mlx_lm.models.lfm2.Model),
quantized by mlx_lm.utils.quantize_model (-> nn.quantize -> mx.quantize) and saved by
mlx_lm.utils.save_model and save_config. The tokenizer is the Qwen3 fixtures' byte-level BPE (same
builder, same bytes); LFM2's own tokenizer is not the point here.

Shape: hidden 64, 2 layers (one short-conv block, one attention block; which comes first
alternates), attention 4 query / 2 KV heads of head_dim 16 with q/k layernorm and full RoPE,
conv_L_cache 3, feed-forward block_ff_dim 96 -> int(2*96/3) = 64 (multiple_of 32), tied head
(mlx-lm's LFM2 always ties), vocab 512. A third layer would put the f32 folder over 400 KB.

The variants alternate the two config forms that exist in the wild and the optional biases:
  * conv_bias = true (biases on in_proj, the conv and out_proj) with the layer kinds given as
    full_attn_idxs, conv block first;
  * conv_bias = false with layer_types, attention block first.
As mlx_lm.convert does with a bf16 Hugging Face checkpoint, the quantized variants quantize the
bf16 model (conv weights and biases stay bf16: nn.Conv1d has no quantized form).

Usage: .venv/bin/python make_mlx_lfm2_fixtures.py [--out DIR] [--seed N]
"""

import argparse
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import lfm2
from mlx_lm.utils import quantize_model, save_config, save_model

from make_mlx_fixtures import REPO, VOCAB, build_tokenizer, folder_size, write_tokenizer

DEFAULT_OUT = REPO / "engine/tests/fixtures/mlx-written"

# (name, conv_bias, quantization or None, dtype of the unquantized tensors)
VARIANTS = [
    ("f32", True, None, mx.float32),
    ("bf16", False, None, mx.bfloat16),
    ("q4", True, dict(mode="affine", bits=4, group_size=64), mx.bfloat16),
    ("q8", False, dict(mode="affine", bits=8, group_size=32), mx.bfloat16),
    ("mxfp4", True, dict(mode="mxfp4", bits=4, group_size=32), mx.bfloat16),
    ("nvfp4", False, dict(mode="nvfp4", bits=4, group_size=16), mx.bfloat16),
    ("mxfp8", True, dict(mode="mxfp8", bits=8, group_size=32), mx.bfloat16),
]

HIDDEN = 64
EMB_STD = 1.0  # the tied embedding is the head: std 1.0 gives clear greedy margins


def model_config(conv_bias: bool, dtype) -> dict:
    config = {
        "architectures": ["Lfm2ForCausalLM"],
        "model_type": "lfm2",
        "block_auto_adjust_ff_dim": True,
        "block_dim": HIDDEN,
        "block_ff_dim": 96,
        "block_ffn_dim_multiplier": 1.0,
        "block_multiple_of": 32,
        "bos_token_id": 509,
        "conv_L_cache": 3,
        "conv_bias": conv_bias,
        "eos_token_id": 511,
        "hidden_size": HIDDEN,
        "intermediate_size": 96,
        "max_position_embeddings": 4096,
        "norm_eps": 1e-5,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32" if dtype == mx.float32 else "bfloat16",
        "vocab_size": VOCAB,
    }
    if conv_bias:
        config["full_attn_idxs"] = [1]
    else:
        config["layer_types"] = ["full_attention", "conv"]
    return config


def init_weights(model: nn.Module, seed: int) -> None:
    """Seeded values that depend only on a parameter's name and the seed.

    Linear ~ N(0, 1/fan_in), except in_proj (three gates multiplied together) at 2/sqrt(fan_in)
    and the projections that write into the residual stream (out_proj, w2) at 8/sqrt(fan_in), so
    the residual is not just the input token's embedding; embedding std EMB_STD; every RMSNorm
    weight 1 + N(0, 0.1²); conv taps N(0, 0.6²); biases N(0, 0.2²).
    """
    params = []
    for name, p in tree_flatten(model.parameters()):
        sub = np.random.default_rng([seed] + list(name.encode()))
        shape = p.shape
        if name.endswith("norm.weight"):
            v = 1.0 + 0.1 * sub.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            v = EMB_STD * sub.standard_normal(shape)
        elif name.endswith(".bias"):
            v = 0.2 * sub.standard_normal(shape)
        elif name.endswith("conv.conv.weight"):
            v = 0.6 * sub.standard_normal(shape)
        elif name.endswith(("out_proj.weight", "w2.weight")):
            v = 8.0 * sub.standard_normal(shape) / np.sqrt(shape[-1])
        elif name.endswith("in_proj.weight"):
            v = 2.0 * sub.standard_normal(shape) / np.sqrt(shape[-1])
        else:
            v = sub.standard_normal(shape) / np.sqrt(shape[-1])
        params.append((name, mx.array(np.asarray(v, dtype=np.float32))))
    model.update(tree_unflatten(params))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)

    tok = build_tokenizer()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, conv_bias, quant, dtype in VARIANTS:
        out = args.out / f"lfm2-{name}"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        config = model_config(conv_bias, dtype)
        model = lfm2.Model(lfm2.ModelArgs.from_dict(config))
        init_weights(model, args.seed)
        model.set_dtype(dtype)
        if quant is not None:
            model, config = quantize_model(
                model, config, quant["group_size"], quant["bits"], mode=quant["mode"]
            )
        mx.eval(model.parameters())
        save_model(out, model)
        save_config(config, out / "config.json")
        write_tokenizer(tok, out)
        size = folder_size(out)
        print(f"{out.relative_to(REPO) if out.is_relative_to(REPO) else out}: {size} bytes")
        largest = max(f.stat().st_size for f in out.iterdir())
        if largest >= 400_000:
            raise SystemExit(f"{out} has a {largest}-byte file, over the 400 KB fixture budget")


if __name__ == "__main__":
    main()
