#!/usr/bin/env python3
"""Side-by-side report of ci/peers/mlx.sh: ours on `--backend mlx` against mlx-lm.

  mlx_report.py OUT_DIR     (reads OUT_DIR/peers-mlx.jsonl; writes peers-mlx.md, .csv, .png)

Each of our row sets (isa `mlx+fast`: the native path, stored dtypes like mlx-lm; `mlx+exact`:
the f32 path) is paired with mlx-lm per model, format and test: median tokens/s of each side
over the repetitions and ours / mlx-lm. Prefill rows also give TTFT, the median of each side.
"""
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from report import pyplot, ratio_plot  # ci/peers/report.py, next to this file


def order(test: str):
    return (0 if test.startswith("pp") else 1, int("".join(c for c in test.split("@")[0] if c.isdigit()) or 0), test)


def summarise(rows):
    groups = defaultdict(list)
    for r in rows:
        groups[(r["engine"], r["isa"], r["model"], r["format"], r["test"])].append(r)
    ours_sets = sorted({r["isa"] for r in rows if r["engine"] == "ours"})
    keys = sorted({(r["model"], r["format"], r["test"]) for r in rows}, key=lambda k: (k[0], k[1], order(k[2])))
    lines = []
    for isa in ours_sets:
        for model, fmt, test in keys:
            o = groups.get(("ours", isa, model, fmt, test), [])
            m = groups.get(("mlx-lm", "mlx", model, fmt, test), [])
            if not o or not m:
                continue
            med = lambda rs, k: statistics.median(r[k] for r in rs) if all(r.get(k) is not None for r in rs) else None
            ot, mt = med(o, "tokens_per_s"), med(m, "tokens_per_s")
            lines.append({"ours": isa, "model": model, "format": fmt, "test": test,
                          "ours_tps": ot, "mlx_lm_tps": mt, "ratio": ot / mt if ot and mt else None,
                          "ours_ttft_ms": med(o, "ttft_ms"), "mlx_lm_ttft_ms": med(m, "ttft_ms"), "n": min(len(o), len(m))})
    return lines


def num(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def markdown(lines, rows, timing) -> str:
    ctx = rows[0] if rows else {}
    mach = ctx.get("machine", {})
    out = ["# Peer benchmark on MLX: ours (`--backend mlx`) vs mlx-lm", "",
           f"Machine: {mach.get('cpu')} ({mach.get('cores')} cores); MLX {ctx.get('mlx')} on {ctx.get('device')}; "
           f"commit {ctx.get('commit')}; BLAS preload: {timing.get('blas') or 'none'}.",
           f"Prompts of {timing.get('lengths')} tokens, {timing.get('gen')} generated; {timing.get('repeats')} "
           "repetition(s), each running mlx-lm then ours back to back per model and format. Values are medians.",
           "Ratios: ours / mlx-lm in tokens/s (> 1 = ours faster). TTFT: prompt in to the first token on the host.", ""]
    for isa in dict.fromkeys(l["ours"] for l in lines):
        title = {"mlx+fast": "native path (`--numerics fast`: stored dtypes, as mlx-lm runs)",
                 "mlx+exact": "f32 path (`--numerics exact`: the goldens' path)"}.get(isa, isa)
        out += [f"## ours {title}", "",
                "| model | format | test | ours t/s | mlx-lm t/s | ours/mlx-lm | ours TTFT ms | mlx-lm TTFT ms |",
                "|---|---|---|--:|--:|--:|--:|--:|"]
        for l in (l for l in lines if l["ours"] == isa):
            out.append(f"| {l['model']} | {l['format']} | {l['test']} | {num(l['ours_tps'])} | {num(l['mlx_lm_tps'])} | "
                       f"{num(l['ratio'])} | {num(l['ours_ttft_ms'], 0)} | {num(l['mlx_lm_ttft_ms'], 0)} |")
        out.append("")
    out.append(f"Run time: {timing.get('total_s')} s.")
    return "\n".join(out) + "\n"


def plot(lines, out: Path):
    plt = pyplot()
    keys = list(dict.fromkeys((l["model"], l["format"], l["test"]) for l in lines))
    if plt is None or not keys:
        return []
    by = {(l["ours"], l["model"], l["format"], l["test"]): l for l in lines}
    sets = dict.fromkeys(l["ours"] for l in lines)
    ratio_plot(plt, out / "peers_mlx_ratio.png", keys,
               {s: [(by.get((s, *k)) or {}).get("ratio") for k in keys] for s in sets},
               "ours / mlx-lm (tokens/s; >1 = ours faster)", "Peer benchmark on MLX: speed ratio")
    return ["peers_mlx_ratio.png"]


def main() -> None:
    out = Path(sys.argv[1])
    rows = [json.loads(l) for l in open(out / "peers-mlx.jsonl") if l.strip()]
    timing = json.loads((out / "timing.json").read_text()) if (out / "timing.json").exists() else {}
    lines = summarise(rows)
    if not lines:
        sys.exit(f"mlx_report.py: no paired rows in {out / 'peers-mlx.jsonl'}")
    (out / "peers-mlx.md").write_text(markdown(lines, rows, timing))
    with open(out / "peers-mlx.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(lines[0].keys()))
        w.writeheader()
        w.writerows(lines)
    pngs = plot(lines, out)
    print(f"mlx_report.py: wrote {', '.join(str(out / n) for n in ['peers-mlx.md', 'peers-mlx.csv', *pngs])}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
