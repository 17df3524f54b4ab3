#!/usr/bin/env python3
"""Can mlx-lm load and run our synthetic checkpoints? One line per folder.

For each folder: mlx_lm.load (model + tokenizer, strict weight loading), a round trip of the
tokenizer (encode/decode of a test string, chat template with a generation prompt), greedy
generation of a few tokens with mlx_lm.generate (weights widened to f32 first). Exits non-zero
if any folder fails.

Usage: check_synth.py DIR [DIR ...]
"""

import json
import sys
import traceback
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

TEXT = "Hello world! 123 Ünïcödé"


def check(folder: Path) -> tuple[bool, str]:
    from mlx_lm import generate, load

    cfg = json.loads((folder / "config.json").read_text())
    fmt = cfg.get("quantization", {}).get("mode", "dense") if cfg.get("quantization") else "dense"
    model, tok = load(str(folder))
    ids = tok.encode(TEXT)
    back = tok.decode(ids)
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                   tokenize=False)
    model.set_dtype(mx.float32)
    out = generate(model, tok, prompt=ids, max_tokens=8, verbose=False)
    notes = [f"model_type={cfg.get('model_type')}", f"quant={fmt}", f"vocab={cfg.get('text_config', cfg).get('vocab_size')}",
             f"eos={sorted(tok.eos_token_ids)}", f"generated {out!r}"]
    ok = True
    if back != TEXT:
        ok = False
        notes.append(f"TOKENIZER ROUND TRIP: {TEXT!r} -> {ids} -> {back!r}")
    if "<|im_start|>" not in chat and "<start_of_turn>" not in chat:
        notes.append(f"chat template output: {chat!r}")
    return ok, "; ".join(notes)


def main() -> None:
    mx.set_default_device(mx.cpu)
    failed = 0
    for arg in sys.argv[1:]:
        folder = Path(arg)
        try:
            ok, msg = check(folder)
        except Exception as e:  # report every folder, not just the first failure
            ok, msg = False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {folder}: {msg}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
