#!/usr/bin/env python3
"""Greedy reference outputs of an independent implementation for a real checkpoint folder, in
the format the engine's oracle reads (harness/src/oracle: `Reference`): Hugging Face
transformers in float32 on the CPU (`--tool transformers`, the default), or for MLX-quantized
folders, which transformers cannot load, mlx-lm in float32 on MLX's CPU device (`--tool mlx-lm`:
the widening and dequantizing of harness/oracle/reference.py).

For every prompt of ci/real/prompts.json: the prompt is tokenized by the folder's own tokenizer
(`tokenizer(text)` with its special tokens, or for chat prompts the rendered chat template with
the generation prompt, tokenized without adding special tokens, as transformers'
apply_chat_template does), then the model runs greedy decoding with its KV cache for
`max_tokens` steps, EOS not applied. Each step records the `top` best log-probs of the
log-softmax of the float32 logits.

Output JSON: {"model": KEY, "reference": {...tool versions, dtype, source}, "cases": [{"name",
"prompt", "chat_user_message" (chat prompts), "prompt_ids", "tokens", "text",
"top_logprobs": [[[id, logprob], ...best first], ...one list per step]}]}.

With `--gguf FILE` (transformers only), the model and the tokenizer come from the GGUF file
through transformers' own reading of it (its dequantizer, tensor names and tokenizer rebuild),
so the reference shares nothing with the engine's import but the file; the folder (the
import) then only lends its chat template where the file has none.

`--tool mlx-lm-native` runs the folder as plain mlx_lm.load leaves it (bf16 stays bf16,
quantized layers stay quantized; the log-probs are mlx-lm's own, in that dtype): the reference
of our MLX backend's native path (goldens/real/mlx-native/KEY.json). Make it with the MLX the
engine links (mlx[cpu]==0.32.2, mlx-lm==0.32.2), so that both sides run the same kernels.

Usage: reference.py --model DIR --key KEY --out FILE [--tool transformers|mlx-lm|mlx-lm-native]
                    [--gguf FILE] [--prompts ci/real/prompts.json] [--source TEXT]
                    [--revision SHA] [--thinking on|off]
Runs where torch (or mlx-lm) is installed (ci/real/requirements.txt); CI only compares.
"""

import argparse
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]


def prompt_ids(tok, prompt, thinking):
    if prompt.get("chat"):
        kwargs = {}
        if thinking is not None:
            kwargs["enable_thinking"] = thinking
        text = tok.apply_chat_template(
            [{"role": "user", "content": prompt["text"]}],
            tokenize=False,
            add_generation_prompt=True,
            **kwargs,
        )
        return tok(text, add_special_tokens=False)["input_ids"]
    return tok(prompt["text"])["input_ids"]


def folder_sha256(folder):
    """The folder's hash as the harness computes it (golden::checkpoint_sha256): every file by
    relative path, sorted, each as its path, a NUL, its length (u64 LE) and its bytes."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        h.update(rel.encode() + b"\0" + path.stat().st_size.to_bytes(8, "little"))
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def gguf_source(gguf):
    """from_pretrained's arguments for a GGUF file (its folder, and the file's name)."""
    return (gguf.parent, {"gguf_file": gguf.name}) if gguf else None


def transformers_runner(folder, gguf=None):
    """Greedy decoding with transformers in float32, and what to record about it."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    where, kwargs = gguf_source(gguf) or (folder, {})
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kwargs)
    model.eval()

    @torch.inference_mode()
    def run(ids, steps, top):
        return greedy_torch(torch, model, ids, steps, top)

    return run, {"transformers": transformers.__version__, "torch": torch.__version__}


def mlx_lm_runner(folder, gguf=None, native=False):
    """Greedy decoding with mlx-lm in float32 (the oracle's widening and dequantizing), or with
    `native` as plain mlx_lm.load leaves the folder (stored dtypes: the reference of our MLX
    backend's native path; make it with the MLX the engine links, 0.32.2)."""
    spec = importlib.util.spec_from_file_location("oracle_reference", ROOT / "harness/oracle/reference.py")
    oracle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oracle)
    mx = oracle.mx
    import mlx_lm

    mx.set_default_device(mx.cpu)
    info = {"mlx-lm": mlx_lm.__version__, "mlx": mx.__version__}
    if native:
        model, _ = mlx_lm.load(str(folder))
    else:
        with oracle.widening_f32_loads():
            model, _ = mlx_lm.load(str(folder))
        info["dequantized_layers"] = oracle.dequantize_to_f32(model)
        model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return (lambda ids, steps, top: oracle.greedy(model, ids, steps, top)), info


def greedy_torch(torch, model, ids, steps, top):
    tokens, tops = [], []
    past = None
    x = torch.tensor([ids], dtype=torch.long)
    for _ in range(steps):
        out = model(input_ids=x, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logprobs = torch.log_softmax(out.logits[0, -1].to(torch.float32), dim=-1)
        values, idx = torch.topk(logprobs, top)
        tops.append([[int(i), float(v)] for i, v in zip(idx, values)])
        nxt = int(idx[0])
        tokens.append(nxt)
        x = torch.tensor([[nxt]], dtype=torch.long)
    return tokens, tops


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--key", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--prompts", type=Path, default=Path(__file__).with_name("prompts.json"))
    ap.add_argument("--tool", choices=["transformers", "mlx-lm", "mlx-lm-native"], default="transformers")
    ap.add_argument("--source", default="", help="where the folder came from (recorded)")
    ap.add_argument("--revision", default="", help="the repo commit the folder is (recorded)")
    ap.add_argument("--thinking", choices=["on", "off"], help="enable_thinking for chat prompts")
    ap.add_argument("--gguf", type=Path, help="read model and tokenizer from this GGUF file")
    args = ap.parse_args()
    if args.gguf and args.tool != "transformers":
        ap.error("--gguf needs --tool transformers")

    spec = json.loads(args.prompts.read_text())
    thinking = None if args.thinking is None else args.thinking == "on"
    where, kwargs = gguf_source(args.gguf) or (args.model, {})
    tok = AutoTokenizer.from_pretrained(where, **kwargs)
    if args.gguf and not tok.chat_template:
        tok.chat_template = AutoTokenizer.from_pretrained(args.model).chat_template
    if args.tool == "transformers":
        run, versions = transformers_runner(args.model, args.gguf)
    else:
        run, versions = mlx_lm_runner(args.model, native=args.tool == "mlx-lm-native")
    if args.gguf:
        versions["gguf"] = args.gguf.name
        versions["gguf_sha256"] = hashlib.sha256(args.gguf.read_bytes()).hexdigest()

    cases = []
    for p in spec["prompts"]:
        ids = prompt_ids(tok, p, thinking)
        tokens, tops = run(ids, spec["max_tokens"], spec["top"])
        case = {
            "name": p["name"],
            "prompt": p["text"],
            "prompt_ids": ids,
            "tokens": tokens,
            "text": tok.decode(tokens, skip_special_tokens=False),
            "top_logprobs": tops,
        }
        if p.get("chat"):
            case["chat_user_message"] = p["text"]
        cases.append(case)
        print(f"{args.key}/{p['name']}: {len(ids)} prompt tokens -> {case['text']!r}", file=sys.stderr)

    out = {"model": args.key}
    if args.tool != "transformers":
        # mlx-lm reads the folder itself, which our import or quantizer wrote: the comparison
        # refuses a reference whose folder has changed since.
        out["checkpoint_sha256"] = folder_sha256(args.model)
    out |= {
        "reference": {
            "tool": args.tool,
            **versions,
            "dtype": "native" if args.tool == "mlx-lm-native" else "float32",
            "source": args.source,
            "revision": args.revision,
            "thinking": args.thinking,
            "script": "ci/real/reference.py",
        },
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
