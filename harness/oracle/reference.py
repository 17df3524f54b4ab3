#!/usr/bin/env python3
"""Greedy reference outputs of mlx-lm (MLX on CPU, float32) for one model folder.

Loads DIR with mlx_lm.load, every bf16/f16 tensor widened to float32 as it is read (before the
model's sanitize, so e.g. Qwen3.5's `norm weight + 1` of original checkpoints is computed in f32
as transformers does, not rounded to bf16 as plain mlx_lm.load would), then makes the whole model
float32:
  * every quantized layer (nn.QuantizedLinear / nn.QuantizedEmbedding, and the stacked experts'
    QuantizedSwitchLinear of MoE families) is replaced by its dense
    twin whose weight is mx.dequantize(packed, scales, biases, ..., dtype=float32), with affine
    scales/biases first cast to float32, so w = scale*q + bias is evaluated in f32 from the stored
    bf16 values (no bf16 rounding of the product); fp-mode (mxfp4/nvfp4/mxfp8) values are exact
    in f32 anyway;
  * every remaining floating parameter (bf16 norms, bf16 dense weights) is cast to float32 with
    nn.Module.set_dtype, which widens bf16 exactly.
Then mlx_lm.generate.generate_step runs greedy decoding (argmax of the step's log-softmax) with
its KV cache. Decoding stops only at --max-tokens: EOS is *not* applied, so the walk is a pure
model-level reference; a consumer that stops at EOS compares the prefix up to it.

Output JSON:
  {"model": DIR, "config": {...folder facts}, "reference": {...versions, dtype, how},
   "cases": [{"prompt_ids": [...], "tokens": [...], "text": "...",
              "top_logprobs": [[[id, logprob], ... best first], ...one list per step]}]}
`text` is the generated ids decoded by the folder's tokenizer (skip_special_tokens=False).
For models with Gated DeltaNet layers (Qwen3.5: config nested under text_config) the file also
says which recurrence mlx-lm ran ("reference.gdn_path") and each case gets a "gdn" record: the
calls it made with their lengths T, and the range of the per-step log decay
g_log = -exp(A_log)·softplus(a + dt_bias) seen, with how many (step, head) gates exp(g_log)
underflowed to 0 in f32. Files for models without such layers are unchanged by this.

With --native the folder loads as plain mlx_lm.load leaves it (bf16 stays bf16, quantized layers
stay quantized with their stored scales) and runs in those dtypes: the reference for our MLX
backend's native path (`--numerics fast` on MLX). Made with the MLX the engine links (see
regenerate_native.sh).

Usage:
  reference.py --model DIR --prompt-ids 1,2,3 [--prompt-ids 4,5 ...] [--chat "text" ...]
               --max-tokens 24 --top 8 --out FILE
               [--label NAME --synth SPEC --checkpoint-sha256 HEX]   (synthetic folders)
"""

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear


def parse_ids(s: str) -> list[int]:
    try:
        return [int(x) for x in s.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids wants comma-separated integers, got {s!r}")


def widening_f32_loads():
    """A context in which mx.load widens every bf16/f16 array to float32 as it is read.

    mlx_lm.load reads the safetensors with mx.load, then hands them to the model's sanitize,
    which may compute with them: Qwen3.5's sanitize turns an original checkpoint's offset norm
    weights into multipliers with `v + 1.0`, which MLX evaluates in the array's dtype, so a bf16
    folder would get bf16(1 + w), while transformers computes (1 + w.float()) in f32. Widening
    first makes every such step f32 (the widening itself is exact, and everything is made f32
    afterwards anyway). Quantized packs (u32) and fp scales (u8) are left as they are.
    """
    import contextlib

    @contextlib.contextmanager
    def ctx():
        orig = mx.load

        def load(path, *a, **kw):
            out = orig(path, *a, **kw)
            if isinstance(out, dict):
                return {k: v.astype(mx.float32) if v.dtype in (mx.bfloat16, mx.float16) else v
                        for k, v in out.items()}
            return out

        mx.load = load
        try:
            yield
        finally:
            mx.load = orig

    return ctx()


def dequantize_to_f32(model: nn.Module) -> int:
    """Replaces quantized layers by dense float32 ones; returns how many were replaced."""
    dense = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)):
            biases = m.get("biases")
            w = mx.dequantize(
                m.weight,
                m.scales.astype(mx.float32) if m.mode == "affine" else m.scales,
                None if biases is None else biases.astype(mx.float32),
                group_size=m.group_size,
                bits=m.bits,
                mode=m.mode,
                dtype=mx.float32,
            )
            if isinstance(m, QuantizedSwitchLinear):
                # Stacked experts [E, out, in] (MoE families): the same dequantize per expert.
                has_bias = "bias" in m
                d = SwitchLinear(w.shape[2], w.shape[1], w.shape[0], bias=has_bias)
                if has_bias:
                    d.bias = m.bias.astype(mx.float32)
            elif isinstance(m, nn.QuantizedLinear):
                has_bias = "bias" in m
                d = nn.Linear(w.shape[1], w.shape[0], bias=has_bias)
                if has_bias:
                    d.bias = m.bias.astype(mx.float32)
            else:
                d = nn.Embedding(w.shape[0], w.shape[1])
            d.weight = w
            dense.append((name, d))
    if dense:
        model.update_modules(tree_unflatten(dense))
    return len(dense)


class GdnRecorder:
    """Wraps mlx-lm's gated-delta entry points to record which recurrence ran, on what lengths.

    gated_delta_update (mlx_lm.models.gated_delta) looks compute_g / gated_delta_ops /
    gated_delta_kernel up as module globals at call time, so replacing them there is seen. The
    wrappers only keep references to their inputs and call the originals: the reference's values
    are computed by exactly the same ops as without them.
    """

    def __init__(self):
        from mlx_lm.models import gated_delta as gd

        self.gd = gd
        self.calls, self.gates = [], []
        orig_g, orig_ops, orig_kernel = gd.compute_g, gd.gated_delta_ops, gd.gated_delta_kernel

        def compute_g(A_log, a, dt_bias):
            self.gates.append((A_log, a, dt_bias))
            return orig_g(A_log, a, dt_bias)

        def ops(q, k, v, g, beta, state=None, mask=None):
            self.calls.append(("gated_delta_ops", int(q.shape[1]), mask is not None))
            return orig_ops(q, k, v, g, beta, state, mask)

        def kernel(q, k, v, g, beta, state, mask=None):
            self.calls.append(("gated_delta_kernel", int(q.shape[1]), mask is not None))
            return orig_kernel(q, k, v, g, beta, state, mask)

        gd.compute_g, gd.gated_delta_ops, gd.gated_delta_kernel = compute_g, ops, kernel

    def take(self) -> dict:
        """The record of the calls since the last take (one case), then forgets them."""
        prefill = [[name, t] for name, t, _ in self.calls if t > 1]
        single = {}
        for name, t, _ in self.calls:
            if t == 1:
                single[name] = single.get(name, 0) + 1
        lo, hi, zero, total = float("inf"), float("-inf"), 0, 0
        for A_log, a, dt_bias in self.gates:
            g_log = -mx.exp(A_log.astype(mx.float32)) * nn.softplus(a.astype(mx.float32) + dt_bias.astype(mx.float32))
            lo, hi = min(lo, g_log.min().item()), max(hi, g_log.max().item())
            zero += int((mx.exp(g_log) == 0).sum().item())
            total += g_log.size
        rec = {
            "calls_with_T_gt_1": prefill,
            "calls_with_T_eq_1": single,
            "masked_calls": sum(1 for c in self.calls if c[2]),
            "g_log_min": round(lo, 4),
            "g_log_max": round(hi, 6),
            "gates_underflowing_to_0": f"{zero} of {total}",
        }
        self.calls, self.gates = [], []
        return rec


def greedy(model, prompt_ids: list[int], max_tokens: int, top: int) -> tuple[list, list]:
    from mlx_lm.generate import generate_step

    tokens, tops = [], []
    prompt = mx.array(prompt_ids, dtype=mx.uint32)
    for _, (tok, logprobs) in zip(range(max_tokens), generate_step(prompt, model, max_tokens=max_tokens)):
        lp = logprobs.astype(mx.float32)
        order = mx.argsort(-lp)[:top].tolist()
        values = lp.tolist()
        tokens.append(int(tok.item() if hasattr(tok, "item") else tok))
        tops.append([[int(i), float(values[i])] for i in order])
        if tokens[-1] != order[0]:
            raise SystemExit(f"greedy token {tokens[-1]} is not the argmax {order[0]}")
    return tokens, tops


def gdn_path_note() -> str:
    on_gpu = mx.default_device() == mx.gpu and mx.metal.is_available()
    return (
        "mlx_lm.models.gated_delta.gated_delta_update -> "
        + ("gated_delta_kernel (Metal, one step at a time per thread)" if on_gpu else
           "gated_delta_ops: a sequential per-step loop over T of the compiled _gated_delta_step_ops "
           "(S = g*S; d = beta*(v - S k); S = S + d k^T; y = S q) with the f32 state [B, Hv, Dv, Dk], "
           "for prefill and decode alike (the Metal kernel needs the GPU); mlx-lm has no chunked "
           "algorithm, so every prompt length here is a per-step reference")
    )


def to_json(out: dict) -> str:
    """Pretty, but one decoding step per line, so a regenerated file diffs step by step."""
    text = json.dumps({k: v for k, v in out.items() if k != "cases"}, indent=1, ensure_ascii=False)
    cases = []
    for c in out["cases"]:
        fields = [f'  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}' for k, v in c.items() if k != "top_logprobs"]
        steps = ",\n".join("   " + json.dumps(step) for step in c["top_logprobs"])
        fields.append(f'  "top_logprobs": [\n{steps}\n  ]')
        cases.append(" {\n" + ",\n".join(fields) + "\n }")
    return text[:-2] + ',\n "cases": [\n' + ",\n".join(cases) + "\n ]\n}\n"


def main() -> None:
    ap = argparse.ArgumentParser(description="mlx-lm greedy reference (CPU, float32)")
    ap.add_argument("--model", required=True, type=Path, help="model folder (config.json, safetensors, tokenizer)")
    ap.add_argument("--prompt-ids", action="append", type=parse_ids, default=[],
                    help="comma-separated prompt token ids; repeat for several cases")
    ap.add_argument("--chat", action="append", default=[],
                    help="a user message; its prompt is the folder's chat template with a generation prompt")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--top", type=int, default=8, help="how many best [id, logprob] pairs to keep per step")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--label", help='the file\'s "model" field [default: the --model path]; for folders '
                    "outside the repository (the harness cache), so the file does not depend on where it was made")
    ap.add_argument("--synth", metavar="SPEC", help="the synthetic spec the folder was made from (recorded)")
    ap.add_argument("--native", action="store_true",
                    help="keep the stored dtypes (no widening, no dequantizing): mlx-lm as users run it")
    ap.add_argument("--checkpoint-sha256", metavar="HEX",
                    help="the folder's hash by `harness oracle prepare` (recorded; the check reports a "
                    "different hash as a stale reference)")
    args = ap.parse_args()
    if not args.prompt_ids and not args.chat:
        ap.error("give at least one --prompt-ids or --chat")
    if not (args.model / "config.json").is_file():
        sys.exit(f"{args.model}: no config.json here; is this a model folder?")

    mx.set_default_device(mx.cpu)
    import mlx_lm
    from mlx_lm import load

    if args.native:
        model, tokenizer, config = load(str(args.model), return_config=True)
    else:
        with widening_f32_loads():
            model, tokenizer, config = load(str(args.model), return_config=True)
    # Qwen3.5-style folders nest the language model's fields under text_config.
    text_config = config.get("text_config", config)
    gdn = GdnRecorder() if any(getattr(l, "is_linear", False) for l in model.layers) else None
    if not args.native:
        replaced = dequantize_to_f32(model)
        model.set_dtype(mx.float32)
    mx.eval(model.parameters())

    cases = []
    prompts = [(ids, None) for ids in args.prompt_ids]
    for msg in args.chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": msg}], add_generation_prompt=True)
        prompts.append((list(ids), msg))
    vocab = text_config["vocab_size"]
    for ids, msg in prompts:
        if not ids or max(ids) >= vocab:
            sys.exit(f"prompt {ids[:8]}... is empty or has an id outside the vocabulary ({vocab})")
        tokens, tops = greedy(model, ids, args.max_tokens, args.top)
        case = {"prompt_ids": ids}
        if msg is not None:
            case["chat_user_message"] = msg
        case.update(tokens=tokens, text=tokenizer.decode(tokens, skip_special_tokens=False))
        if gdn is not None:
            case["gdn"] = gdn.take()
        case["top_logprobs"] = tops
        cases.append(case)
        margin = min(t[0][1] - t[1][1] for t in tops)
        print(f"{args.model.name}: prompt of {len(ids)} -> {tokens[:8]}... min top1-top2 margin {margin:.4f}")

    q = config.get("quantization")
    out = {"model": args.label or str(args.model)}
    if args.synth:
        out["synth"] = args.synth
    if args.checkpoint_sha256:
        out["checkpoint_sha256"] = args.checkpoint_sha256
    out |= {
        "config": {
            "model_type": config.get("model_type"),
            "tie_word_embeddings": text_config.get("tie_word_embeddings"),
            "quantization": q,
        },
        "reference": {
            "implementation": f"mlx-lm {mlx_lm.__version__}, mlx {mx.__version__}, device cpu",
            "dtype": "native" if args.native else "float32",
            "upcast": "none: plain mlx_lm.load, stored dtypes" if args.native else
            "bf16/f16 tensors widened to f32 as read, before the model's sanitize; "
            f"{replaced} quantized layers dequantized to f32 (affine scales/biases cast to f32 first); "
            "other params set_dtype(float32)",
            "decoding": "greedy (argmax of log-softmax), no EOS stop, mlx_lm.generate.generate_step",
            "max_tokens": args.max_tokens,
            "top": args.top,
        },
        "cases": cases,
    }
    if gdn is not None:
        out["reference"]["gdn_path"] = gdn_path_note()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(to_json(out))


if __name__ == "__main__":
    main()
