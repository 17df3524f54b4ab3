#!/usr/bin/env python3
"""Times mlx-lm on one checkpoint folder the way `harness sweep` times our engine.

  mlx_lm_bench.py --model DIR --lengths 1,512,1024 --gen 32 --out RAW.jsonl

For each prompt length: TTFT (ids in, the first token's logits evaluated and the token read on
the host: mlx-lm's own prefill chunks plus its first step) and decode tokens/s over the next
GEN-1 tokens (mlx-lm's `generate_step`, with its asynchronous evaluation pipelining). Weights
load with plain `mlx_lm.load`, so they stay in their stored dtype (bf16 stays bf16, quantized
stays packed with its bf16 scales): the way users run mlx-lm. One warm-up generation first, so
MLX's one-time kernel compilation (mx.compile'd helpers) is not counted.

Lines match `harness sweep`'s fields that ci/peers/rows.py reads (prompt_tokens,
generated_tokens, max_tokens, ttft_ms, prefill_tokens_per_s, decode_tokens_per_s).
"""
import argparse
import json
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step


def prompt_ids(n: int, vocab: int) -> mx.array:
    # Deterministic ids away from the special tokens at the top of the vocabulary; the speed of
    # a dense model does not depend on them.
    return mx.array([(7919 * i + 13) % min(vocab - 512, 100_000) for i in range(n)], dtype=mx.uint32)


def run(model, n: int, gen: int, vocab: int) -> dict:
    ids = prompt_ids(n, vocab)
    t0 = time.perf_counter()
    steps = generate_step(ids, model, max_tokens=gen)
    first, _ = next(steps)  # generate_step yields host ints: the first token is evaluated
    t1 = time.perf_counter()
    got = 1
    for _tok, _lp in steps:
        got += 1
    t2 = time.perf_counter()
    ttft = t1 - t0
    return {
        "prompt_tokens": n,
        "max_tokens": gen,
        "generated_tokens": got,
        "ttft_ms": ttft * 1e3,
        "prefill_tokens_per_s": n / ttft,
        "decode_tokens_per_s": (got - 1) / (t2 - t1) if got > 1 and t2 > t1 else None,
        "first_token": int(first),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--lengths", default="1,512,1024")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    model, _tok = load(a.model)
    vocab = model.args.vocab_size if hasattr(model, "args") and hasattr(model.args, "vocab_size") else 32_000
    run(model, 16, 4, vocab)  # warm-up
    meta = {"engine": "mlx-lm", "device": str(mx.default_device()), "mlx": mx.__version__}
    with open(a.out, "a") as f:
        for n in (int(x) for x in a.lengths.split(",")):
            row = run(model, n, a.gen, vocab)
            f.write(json.dumps({**meta, **row}) + "\n")
            f.flush()


if __name__ == "__main__":
    main()
