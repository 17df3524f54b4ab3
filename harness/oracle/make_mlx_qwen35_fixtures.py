#!/usr/bin/env python3
"""Writes tiny Qwen3.5 dense (Gated DeltaNet hybrid) checkpoints *with mlx-lm itself*.

Sibling of make_mlx_fixtures.py (which writes the Qwen3 folders and is left untouched so their
bytes never move). Same independence argument: the model is mlx-lm's own class
(mlx_lm.models.qwen3_5.Model, whose full-attention layer and MLP come from qwen3_next), quantized
by mlx_lm.utils.quantize_model (-> nn.quantize -> mx.quantize) and saved by mlx_lm.utils.save_model
and save_config. The tokenizer is the Qwen3 fixtures' byte-level BPE (same builder, same bytes).

As mlx_lm.convert does with a bf16 Hugging Face checkpoint, the bf16 cast honours the model's
cast_predicate (A_log stays float32) and the quantized variants quantize that bf16 model.

Shape: hidden 64, 4 layers with full_attention_interval 4 (layers 0-2 Gated DeltaNet, layer 3
gated full attention), attention 2 query heads / 1 KV head of head_dim 32 with a sigmoid output
gate and partial rotary 0.25 (8 of 32 dims), GDN 2 key heads / 4 value heads (Hv/Hk = 2) of dims
32/32, conv kernel 4, MLP 64 (128 would put the untied f32 folder over 1 MiB), vocab 512.

Usage: .venv/bin/python make_mlx_qwen35_fixtures.py [--out DIR] [--seed N]
"""

import argparse
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path, tree_unflatten
from mlx_lm.models import qwen3_5
from mlx_lm.utils import quantize_model, save_config, save_model

from make_mlx_fixtures import REPO, VOCAB, build_tokenizer, folder_size, write_tokenizer

DEFAULT_OUT = REPO / "engine/tests/fixtures/mlx-written"

# (name, tie_word_embeddings, quantization or None, dtype of the unquantized tensors) — the same
# tie pattern as the Qwen3 folders, so both tied and untied heads are covered in every family.
VARIANTS = [
    ("f32", False, None, mx.float32),
    ("bf16", True, None, mx.bfloat16),
    ("q4", True, dict(mode="affine", bits=4, group_size=64), mx.bfloat16),
    ("q8", False, dict(mode="affine", bits=8, group_size=32), mx.bfloat16),
    ("mxfp4", True, dict(mode="mxfp4", bits=4, group_size=32), mx.bfloat16),
    ("nvfp4", False, dict(mode="nvfp4", bits=4, group_size=16), mx.bfloat16),
    ("mxfp8", True, dict(mode="mxfp8", bits=8, group_size=32), mx.bfloat16),
]

EMB_STD = 1.0  # embedding/lm_head std: 1.0 rather than Qwen3's 0.7 gives this model clearer greedy margins
LAYERS = 4
INTERVAL = 4
HEAD_DIM = 32
ROTARY = 0.25

# Per GDN layer, per value head: A = exp(A_log). The per-step log decay is
# g_log = -A * softplus(a + dt_bias), with a ~ N(0, 1) from in_proj_a, so these span "almost no
# decay" (A = 0.002: g ~ 0.998 per step) to "forget everything" (A = 60: g_log often below -104,
# where exp() underflows f32 to 0 — the chunked path must stay in log space there).
A_VALUES = [
    [0.002, 0.3, 3.0, 60.0],
    [0.02, 1.0, 12.0, 0.1],
    [0.005, 0.05, 30.0, 2.0],
]
# dt_bias per layer and head: softplus(dt_bias) from about 0.3 to 2.1.
DT_BIAS = [
    [0.5, -1.0, 0.0, 2.0],
    [-0.5, 1.0, 0.5, 0.0],
    [1.5, 0.0, -1.0, 0.5],
]


def text_config(tie: bool, dtype) -> dict:
    assert int(HEAD_DIM * ROTARY) == 8, "mrope_section below assumes 8 rotary dims"
    return {
        "model_type": "qwen3_5_text",
        "attention_bias": False,
        "attn_output_gate": True,
        "bos_token_id": 509,
        "eos_token_id": 511,
        "dtype": "float32" if dtype == mx.float32 else "bfloat16",
        "full_attention_interval": INTERVAL,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 64,
        "layer_types": [
            "full_attention" if (i + 1) % INTERVAL == 0 else "linear_attention" for i in range(LAYERS)
        ],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_value_head_dim": 32,
        "max_position_embeddings": 4096,
        "num_attention_heads": 2,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-6,
        # Real Qwen3.5 uses interleaved M-RoPE; for text all three position streams are equal, so
        # it is plain (non-interleaved, rotate-half) RoPE over the first 8 dims, which is what
        # mlx-lm computes (nn.RoPE(8, traditional=False)). mrope_section sums to rotary_dims/2.
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [2, 1, 1],
            "partial_rotary_factor": ROTARY,
            "rope_theta": 10000000.0,
            "rope_type": "default",
        },
        "tie_word_embeddings": tie,
        "vocab_size": VOCAB,
    }


def model_config(tie: bool, dtype) -> dict:
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_config(tie, dtype),
        "tie_word_embeddings": tie,
    }


def init_weights(model: nn.Module, seed: int) -> None:
    """Seeded values that depend only on a parameter's name and the seed.

    As in make_mlx_fixtures.init_weights: Linear ~ N(0, 1/fan_in), except the projections that
    write into the residual stream (o_proj, out_proj, down_proj) at 16/sqrt(fan_in) so the
    residual is not just the input token's embedding; embedding/lm_head std EMB_STD for peaky logits;
    every RMSNorm weight (layer norms, q/k norms, the GDN gated norm) 1 + N(0, 0.1²).
    GDN specifics: conv1d taps N(0, 0.5²); A_log and dt_bias from the fixed tables above.
    """
    params = []
    for name, p in tree_flatten(model.parameters()):
        sub = np.random.default_rng([seed] + list(name.encode()))
        shape = p.shape
        if name.endswith("norm.weight"):
            v = 1.0 + 0.1 * sub.standard_normal(shape)
        elif name in ("language_model.model.embed_tokens.weight", "language_model.lm_head.weight"):
            v = EMB_STD * sub.standard_normal(shape)
        elif name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
            v = 16.0 * sub.standard_normal(shape) / np.sqrt(shape[-1])
        elif name.endswith("conv1d.weight"):
            v = 0.5 * sub.standard_normal(shape)
        elif name.endswith(("A_log", "dt_bias")):
            layer = int(name.split(".layers.")[1].split(".")[0])
            table = A_VALUES if name.endswith("A_log") else DT_BIAS
            row = np.array(table[layer], dtype=np.float64)
            v = np.log(row) if name.endswith("A_log") else row
        else:
            v = sub.standard_normal(shape) / np.sqrt(shape[-1])
        params.append((name, mx.array(np.asarray(v, dtype=np.float32))))
    model.update(tree_unflatten(params))


def cast_like_convert(model: nn.Module, dtype) -> None:
    """mlx_lm.convert's cast: floating params to dtype unless model.cast_predicate says no."""
    keep = model.cast_predicate

    def cast(path, v):
        return v.astype(dtype) if keep(path) and mx.issubdtype(v.dtype, mx.floating) else v

    model.update(tree_map_with_path(cast, model.parameters()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)

    tok = build_tokenizer()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, tie, quant, dtype in VARIANTS:
        out = args.out / f"qwen3_5-{name}"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        config = model_config(tie, dtype)
        model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(config))
        init_weights(model, args.seed)
        cast_like_convert(model, dtype)
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
        if size >= 1 << 20:
            raise SystemExit(f"{out} is {size} bytes, over the 1 MiB fixture budget")


if __name__ == "__main__":
    main()
