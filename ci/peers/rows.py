#!/usr/bin/env python3
"""Normalise one benchmark run's raw output into peer rows, appended to ROWS.jsonl.

  rows.py llama RAW.jsonl ROWS.jsonl --isa native --model qwen3 --format q4 --repeat 0 [--weights W] [--context JSON]
  rows.py ours  RAW.jsonl ROWS.jsonl --isa avx2   --model qwen3 --format q4 --repeat 0 [--weights W] [--numerics N] [--context JSON]
  rows.py mlx_lm RAW.jsonl ROWS.jsonl --isa mlx-cpu --model qwen3 --format q4 --repeat 0 [--context JSON]

RAW is llama-bench's `-o jsonl`, `harness sweep`'s output or mlx_lm_bench.py's (the sweep's fields),
holding this run's lines only.
One row per (engine, isa, model, format, test, repeat):
  engine       ours | llama.cpp | mlx-lm
  isa          native | avx2 (the instruction-set cap the run was built / started with); ours
               with numerics other than its defaults adds them: native+exact, native+fast
  numerics     ours only: the --numerics the run used (for the defaults, what they resolved to)
  model        qwen3 | qwen3_5 (bench widths, synthetic weights) | smollm2 (real)
  format       bf16 | q4 | q8 (the class compared); weights: the engine's own encoding (--weights,
               else the synthetic checkpoints' encoding per format)
  test         pp512, pp1024 (prefill), tg32 (decode from an empty context), tg32@d512 (decode
               after 512 tokens), like llama-bench's test names
  metric       prefill | decode | decode@512 | decode@1024
  prompt_tokens, depth, gen_tokens, tokens_per_s, repeat, engine_commit, machine, commit, ...
"""
import argparse
import json
import os
import sys
import time

WEIGHTS = {
    "ours": {"bf16": "bf16", "q4": "MLX affine q4 g64", "q8": "MLX affine q8 g32"},
    "llama.cpp": {"bf16": "BF16", "q4": "Q4_0", "q8": "Q8_0"},
    "mlx-lm": {"bf16": "bf16", "q4": "MLX affine q4 g64", "q8": "MLX affine q8 g32"},
}


def llama_rows(lines):
    for r in lines:
        p, n, d = r["n_prompt"], r["n_gen"], r["n_depth"]
        if p > 0 and n == 0:
            test, metric, prompt, depth = f"pp{p}" + (f"@d{d}" if d else ""), "prefill", p, d
        elif n > 0 and p == 0:
            test, metric, prompt, depth = f"tg{n}" + (f"@d{d}" if d else ""), "decode" + (f"@{d}" if d else ""), 0, d
        else:  # pp+tg combined tests are not run by run.sh
            continue
        yield {"test": test, "metric": metric, "prompt_tokens": prompt, "depth": depth, "gen_tokens": n,
               "tokens_per_s": r["avg_ts"], "engine_commit": r.get("build_commit"),
               "engine_detail": {k: r.get(k) for k in ("model_type", "model_size", "n_threads", "n_batch", "n_ubatch",
                                                      "flash_attn", "type_k", "type_v", "repack")}}


def ours_rows(lines):
    for r in lines:
        p, n = r["prompt_tokens"], r.get("generated_tokens", r.get("max_tokens"))
        common = {"engine_commit": r.get("commit"), "engine_detail": {"path": r.get("path"), "backend": r.get("backend"),
                                                                      "output_sha256": r.get("output_sha256")}}
        if p > 1:  # a 1-token prompt only serves the decode-from-empty row
            yield {"test": f"pp{p}", "metric": "prefill", "prompt_tokens": p, "depth": 0, "gen_tokens": 0,
                   "tokens_per_s": r["prefill_tokens_per_s"], "ttft_ms": r.get("ttft_ms"), **common}
        if n and r.get("decode_tokens_per_s"):
            depth = 0 if p <= 1 else p
            yield {"test": f"tg{r.get('max_tokens', n)}" + (f"@d{depth}" if depth else ""),
                   "metric": "decode" + (f"@{depth}" if depth else ""), "prompt_tokens": 0, "depth": depth,
                   "gen_tokens": n, "tokens_per_s": r["decode_tokens_per_s"], **common}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("engine", choices=["llama", "ours", "mlx_lm"])
    ap.add_argument("raw")
    ap.add_argument("rows")
    ap.add_argument("--isa", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--format", required=True)
    ap.add_argument("--repeat", type=int, required=True)
    ap.add_argument("--weights", help="the encoding of the weights (default: WEIGHTS for the format)")
    ap.add_argument("--numerics", help="ours: the numerics the run used")
    ap.add_argument("--context", default="{}", help="JSON merged into every row (machine, commit, ...)")
    a = ap.parse_args()
    engine = {"llama": "llama.cpp", "ours": "ours", "mlx_lm": "mlx-lm"}[a.engine]
    lines = [json.loads(l) for l in open(a.raw) if l.strip().startswith("{")]
    rows = list((llama_rows if a.engine == "llama" else ours_rows)(lines))
    if not rows:
        sys.exit(f"rows.py: no measurements in {a.raw}")
    base = {"engine": engine, "isa": a.isa, "model": a.model, "format": a.format,
            "weights": a.weights or WEIGHTS[engine].get(a.format, a.format), "repeat": a.repeat,
            **({"numerics": a.numerics} if a.numerics else {}),
            "loadavg_1m": round(os.getloadavg()[0], 2), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **json.loads(a.context)}
    with open(a.rows, "a") as f:
        for r in rows:
            f.write(json.dumps({**base, **r}) + "\n")


if __name__ == "__main__":
    main()
