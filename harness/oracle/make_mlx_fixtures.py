#!/usr/bin/env python3
"""Writes tiny Qwen3 checkpoints *with mlx-lm itself* into engine/tests/fixtures/mlx-written/.

The point is independence: the folders' layout, names, dtypes and quantized tensors come from
mlx-lm's own model class (mlx_lm.models.qwen3), its own quantizer (mlx_lm.utils.quantize_model ->
nn.quantize -> mx.quantize) and its own writers (mlx_lm.utils.save_model / save_config), not from
our Rust code. The tokenizer is a small byte-level BPE trained with the `tokenizers` library.

Every variant starts from the same seeded base weights. f32 and bf16 are plain casts; the quantized
variants quantize the bf16 model (as mlx_lm.convert does with a bf16 Hugging Face checkpoint), so
their unquantized tensors (RMSNorm weights) stay bf16.

Usage: .venv/bin/python make_mlx_fixtures.py [--out DIR] [--seed N]
"""

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import qwen3
from mlx_lm.utils import quantize_model, save_config, save_model
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "engine/tests/fixtures/mlx-written"

VOCAB = 512
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 509, 510, 511 as in Qwen's order

# ChatML, the shape Qwen3's template takes without tools or thinking blocks.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2/3's pre-tokenizer split pattern (digits one at a time, contractions, letters, punctuation).
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (name, tie_word_embeddings, quantization or None, dtype of the unquantized tensors)
VARIANTS = [
    ("f32", False, None, mx.float32),
    ("bf16", True, None, mx.bfloat16),
    ("q4", True, dict(mode="affine", bits=4, group_size=64), mx.bfloat16),
    ("q8", False, dict(mode="affine", bits=8, group_size=32), mx.bfloat16),
    ("mxfp4", True, dict(mode="mxfp4", bits=4, group_size=32), mx.bfloat16),
    ("nvfp4", False, dict(mode="nvfp4", bits=4, group_size=16), mx.bfloat16),
    ("mxfp8", True, dict(mode="mxfp8", bits=8, group_size=32), mx.bfloat16),
]


def model_config(tie: bool, dtype) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": tie,
        "attention_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 509,
        "eos_token_id": 511,
        "torch_dtype": "float32" if dtype == mx.float32 else "bfloat16",
    }


def training_corpus() -> list[str]:
    """A few KB of varied text so BPE learns 253 merges; deterministic, no download."""
    words = (
        "the quick brown fox jumps over a lazy dog while engineers measure prefill and decode "
        "speed on small machines; tokens flow through attention, norms and feed forward layers. "
        "Hello world! How are you today? I am fine, thank you. Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 "
        "2024 3.14159. Code: fn main() { let x = vec![1, 2, 3]; println!(\"{x:?}\"); } "
        "def f(a, b):\n    return a + b\n"
    ).split(" ")
    rng = np.random.default_rng(1234)
    lines = [" ".join(words)]
    for _ in range(400):
        n = int(rng.integers(4, 16))
        lines.append(" ".join(words[int(i)] for i in rng.integers(0, len(words), n)))
    lines += ["User: what is the capital of France?\nAssistant: Paris.", "Ünïcödé ✓ 日本語 текст"]
    return lines


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPECIALS),
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    if tok.get_vocab_size() != VOCAB - len(SPECIALS):
        raise SystemExit(f"BPE learned {tok.get_vocab_size()} tokens, wanted {VOCAB - 3}")
    tok.add_special_tokens(SPECIALS)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == VOCAB - len(SPECIALS) + i
    return tok


def write_tokenizer(tok: Tokenizer, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(tok.token_to_id(s)): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for s in SPECIALS
    }
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    gen = {"bos_token_id": 509, "eos_token_id": [511, 509], "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def init_weights(model: nn.Module, seed: int) -> None:
    """Seeded, variant-independent values: a parameter's values depend only on its name and seed.

    Linear weights ~ N(0, 1/fan_in), except the two projections that write into the residual
    stream (o_proj, down_proj) at 16/sqrt(fan_in): with random weights and a tied embedding the
    residual is otherwise dominated by the input token's own embedding and greedy decoding just
    repeats one token, which would test nothing. Embedding and lm_head have std 0.7 so logits
    spread by several nats and greedy picks have margins (reference.py prints the smallest).
    RMSNorm weights are 1 + N(0, 0.1²) so a norm bug cannot hide behind all-ones.
    """
    params = []
    for name, p in tree_flatten(model.parameters()):
        # an independent stream per parameter: the seed followed by the name's bytes
        sub = np.random.default_rng([seed] + list(name.encode()))
        shape = p.shape
        if name.endswith("norm.weight"):
            v = 1.0 + 0.1 * sub.standard_normal(shape)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            v = 0.7 * sub.standard_normal(shape)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            v = 16.0 * sub.standard_normal(shape) / np.sqrt(shape[-1])
        else:
            v = sub.standard_normal(shape) / np.sqrt(shape[-1])
        params.append((name, mx.array(v.astype(np.float32))))
    model.update(tree_unflatten(params))


def folder_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.iterdir() if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)

    tok = build_tokenizer()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, tie, quant, dtype in VARIANTS:
        out = args.out / f"qwen3-{name}"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        config = model_config(tie, dtype)
        model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
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
        if size >= 1 << 20:
            raise SystemExit(f"{out} is {size} bytes, over the 1 MiB fixture budget")


if __name__ == "__main__":
    main()
