#!/usr/bin/env python3
"""Turn a peer run's rows into a comparison: peers.md, peers.csv and PNG plots.

Usage: report.py OUT_DIR     (reads OUT_DIR/peers.jsonl, weights.json, machine-*.json, timing.json)

Pairs our engine with llama.cpp per ISA (native, avx2), model, format and test, like llama.cpp's
compare-llama-bench.py: median t/s of each side over the repetitions, and ours/llama.cpp.
Efficiency, against this machine's limits measured in the same run (best of start and end):
prefill = tokens/s x model FLOPs per token / GEMM FLOP/s; decode = tokens/s x weight bytes per
token / read bandwidth. Stdlib only; plots need matplotlib (skipped without it).
"""
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ENGINES = ("ours", "llama.cpp")
# Our row sets, each paired with the llama.cpp build of its base ISA: the defaults (bare ISA),
# then named numerics.
ISAS = ("native", "native+exact", "native+fast", "avx2", "avx2+exact", "avx2+fast")


def TEST_ORDER(t: str):
    """pp before tg, then by length, then by depth (tg32 < tg32@d512 < tg32@d1024)."""
    head, _, depth = t.partition("@d")
    return (0 if t.startswith("pp") else 1, int(head[2:]), int(depth or 0))


def load(out: Path):
    rows = [json.loads(l) for l in open(out / "peers.jsonl") if l.strip()]
    weights = json.loads((out / "weights.json").read_text())
    machines = [json.loads(p.read_text()) for p in sorted(out.glob("machine-*.json"))]
    timing = json.loads((out / "timing.json").read_text()) if (out / "timing.json").exists() else {}
    return rows, weights, machines, timing


def summarise(rows, weights, limits):
    groups = defaultdict(list)
    for r in rows:
        groups[(r["isa"], r["model"], r["format"], r["test"], r["engine"])].append(r)
    keys = sorted({k[:4] for k in groups if k[4] == "ours"}, key=lambda k: (ISAS.index(k[0]) if k[0] in ISAS else 9, k[1], ["bf16", "q8", "q4"].index(k[2]) if k[2] in ("bf16", "q8", "q4") else 9, TEST_ORDER(k[3])))
    out = []
    for isa, model, fmt, test in keys:
        line = {"isa": isa, "model": model, "format": fmt, "test": test}
        by_rep = {}  # engine -> {repetition: tokens/s}
        for e in ENGINES:
            # llama.cpp has one build per ISA; our `+exact` and `+fast` rows pair with it too.
            rs = groups.get((isa if e == "ours" else isa.split("+")[0], model, fmt, test, e), [])
            tps = sorted(r["tokens_per_s"] for r in rs)
            by_rep[e] = {r["repeat"]: r["tokens_per_s"] for r in rs}
            line[f"{e}_weights"] = rs[0]["weights"] if rs else ""
            line[f"{e}_n"] = len(tps)
            line[f"{e}_tps"] = statistics.median(tps) if tps else None
            line[f"{e}_min"] = tps[0] if tps else None
            line[f"{e}_max"] = tps[-1] if tps else None
            line[f"{e}_eff"] = efficiency(e, model, fmt, test, line[f"{e}_tps"], weights, limits)
            if e == "ours":
                line["ours_numerics"] = "/".join(sorted({r.get("numerics", "exact") for r in rs}))
        o, l = line["ours_tps"], line["llama.cpp_tps"]
        line["ratio"] = o / l if o and l else None
        # The spread of the ratio: ours over llama.cpp within each repetition (they ran back to
        # back, so a load drift hits both), min and max over the repetitions.
        ours, llama = by_rep["ours"], by_rep["llama.cpp"]
        paired = [ours[k] / llama[k] for k in ours if llama.get(k)]
        line["ratio_min"] = min(paired) if paired else None
        line["ratio_max"] = max(paired) if paired else None
        out.append(line)
    return out


def efficiency(engine, model, fmt, test, tps, weights, limits):
    if not tps:
        return None
    if test.startswith("pp"):
        flops = weights.get(f"ours/{model}/bf16", {}).get("flops_per_token")
        return tps * flops / (limits["gemm_f32_gflops"] * 1e9) if flops else None
    nbytes = weights.get(f"{engine}/{model}/{fmt}", {}).get("decode_bytes_per_token")
    return tps * nbytes / (limits["bw_read_gbs"] * 1e9) if nbytes else None


def fmt_num(x, nd=2):
    return "" if x is None else f"{x:.{nd}f}"


def fmt_pct(x):
    return "" if x is None else f"{100 * x:.0f}%"


def markdown(lines, weights, limits, machines, timing, rows) -> str:
    m0 = machines[0] if machines else {}
    commits = sorted({r.get("commit", "") for r in rows})
    ecommits = sorted({f"{r['engine']} {r.get('engine_commit')}" for r in rows})
    out = ["# Peer benchmark: ours vs llama.cpp (CPU)", ""]
    out.append(f"Machine: {m0.get('cpu')} ({m0.get('cores')} cores; {' '.join(m0.get('isa_flags', []))}), "
               f"{m0.get('threads')} threads per engine. Scripts at repo commit {', '.join(commits)}; "
               f"engines: {', '.join(ecommits)}; llama-cpp-python sdist {timing.get('llama_cpp_python', '?')}.")
    bins = sorted({(h["path"], h["built_utc"], h["sha256_16"]) for h in (r.get("harness") for r in rows) if h})
    if bins:
        out.append("Ours ran as " + "; ".join(f"`{p}` (built {b} UTC, sha256 {h}…)" for p, b, h in bins) +
                   "; its recorded commit is the checkout's at run time.")
    out.append(f"Repetitions: {timing.get('repeats', '?')} (interleaved: per repetition, per model and format, "
               f"per ISA ({timing.get('isas', 'native avx2')}), llama.cpp then ours). Values are medians; "
               "min–max in peers.csv.")
    out.append("")
    out.append(f"Limits measured in this run (best of {len(machines)}): f32 GEMM (best of numpy/OpenBLAS and torch, "
               f"n={m0.get('gemm_n')}, {m0.get('threads')} threads) **{limits['gemm_f32_gflops']:.1f} GFLOP/s**; memory read bandwidth "
               f"**{limits['bw_read_gbs']:.1f} GB/s** (copy {limits['bw_copy_gbs']:.1f}, write {limits['bw_write_gbs']:.1f}). "
               "Per measurement: " + "; ".join(
                   f"{i}: {m['gemm_f32_gflops']} GFLOP/s, {m['bw_read_gbs']} GB/s" for i, m in
                   zip(("start", "end"), machines)) + ".")
    out.append("")
    out.append("eff: prefill = model FLOP/s ÷ GEMM FLOP/s (model FLOPs/token = 2 × decoder matmul weights); "
               "decode = weight bytes/token × tokens/s ÷ read bandwidth. "
               "tgN = decode of N tokens from an empty context (ours: after a 1-token prompt); tgN@dD = after D tokens.")
    for isa in ISAS:
        sel = [l for l in lines if l["isa"] == isa]
        if not sel:
            continue
        title = ("native (llama.cpp -march=native; ours unrestricted)" if isa.startswith("native") else
                 "AVX2-capped (llama.cpp built without AVX-512; ours with ENGINE_CPU_ISA=avx2)")
        if isa.endswith("+fast"):
            title += ", ours with --numerics fast (int8 activations for 4-bit, bf16 for bf16 weights)"
        elif isa.endswith("+exact"):
            title += ", ours with --numerics exact (f32 activations)"
        else:
            title += ", ours with its defaults (no --numerics; the numerics column says what that ran)"
        out += ["", f"## {title}", "",
                "| model | format (ours / llama.cpp) | ours numerics | test | ours t/s | llama.cpp t/s | ours/llama.cpp | per repetition | ours eff | llama.cpp eff |",
                "|---|---|---|---|--:|--:|--:|--|--:|--:|"]
        for l in sel:
            out.append(f"| {l['model']} | {l['ours_weights'] or l['format']} / {l['llama.cpp_weights'] or l['format']} | "
                       f"{l['ours_numerics']} | {l['test']} | {fmt_num(l['ours_tps'])} | {fmt_num(l['llama.cpp_tps'])} | "
                       f"{fmt_num(l['ratio'])} | {fmt_num(l['ratio_min'])}–{fmt_num(l['ratio_max'])} | "
                       f"{fmt_pct(l['ours_eff'])} | {fmt_pct(l['llama.cpp_eff'])} |")
    # What the ISA cap costs each engine.
    by = {(l["isa"], l["model"], l["format"], l["test"]): l for l in lines}
    isa_rows = []
    for (isa, model, fmt, test), l in by.items():
        a = by.get(("avx2", model, fmt, test))
        if isa == "native" and a:
            isa_rows.append((model, fmt, test, *(l[f"{e}_tps"] / a[f"{e}_tps"] if l[f"{e}_tps"] and a[f"{e}_tps"] else None
                                                  for e in ENGINES)))
    if isa_rows:
        out += ["", "## native ÷ AVX2-capped, per engine", "", "| model | format | test | ours | llama.cpp |",
                "|---|---|---|--:|--:|"]
        out += [f"| {m} | {f} | {t} | {fmt_num(o)} | {fmt_num(ll)} |" for m, f, t, o, ll in isa_rows]
    out += ["", "## Weight bytes per decode token and model FLOPs per token", "",
            "| key | decode bytes/token | FLOPs/token |", "|---|--:|--:|"]
    for k, v in sorted(weights.items()):
        out.append(f"| {k} | {v['decode_bytes_per_token'] / 2**20:.1f} MiB | "
                   f"{fmt_num(v['flops_per_token'] / 1e9, 3) + ' G' if v.get('flops_per_token') and k.endswith('/bf16') else ''} |")
    if timing:
        out += ["", f"Run time: setup {timing.get('setup_s')} s, checkpoints {timing.get('models_s')} s, "
                    f"benchmark {timing.get('bench_s')} s, total {timing.get('total_s')} s."]
    return "\n".join(out) + "\n"


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None (with a note) when it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib not installed; no plots", file=sys.stderr)
        return None
    return plt


def ratio_plot(plt, path: Path, keys, series: dict, xlabel: str, title: str) -> None:
    """Horizontal bars of speed ratios per key, one bar per series, growing from parity (1) on
    a log axis, so 2x and 0.5x look alike. `series` maps a label to one ratio per key (None
    draws nothing)."""
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(keys) + 1.5))
    h = 0.8 / max(1, len(series))
    for i, (label, vals) in enumerate(series.items()):
        ax.barh([y + (i - (len(series) - 1) / 2) * h for y in range(len(keys))],
                [(v or 1.0) - 1 for v in vals], left=1, height=h, label=label)
    ax.set_xscale("log")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(range(len(keys)), [" ".join(k) for k in keys], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plots(lines, out: Path):
    plt = pyplot()
    if plt is None:
        return []
    by = {(l["isa"], l["model"], l["format"], l["test"]): l for l in lines}
    # Every variant of ours the run has (exact and, when measured, --numerics fast).
    isas = [isa for isa in ISAS if any(l["isa"] == isa and l.get("ratio") for l in lines)]
    keys = [k for k in dict.fromkeys((l["model"], l["format"], l["test"]) for l in lines)
            if any((by.get((isa, *k)) or {}).get("ratio") for isa in isas)]
    if not keys:
        return []
    ratio_plot(plt, out / "peers_ratio.png", keys,
               {isa: [(by.get((isa, *k)) or {}).get("ratio") for k in keys] for isa in isas},
               "ours / llama.cpp (tokens/s; >1 = ours faster)", "Peer benchmark on CPU: speed ratio")

    keys = [k for k in dict.fromkeys((l["model"], l["format"], l["test"]) for l in lines)
            if all((by.get(("native", *k)) or {}).get(f"{e}_eff") for e in ENGINES)]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(keys) + 1.5))
    h = 0.4
    for i, e in enumerate(ENGINES):
        vals = [100 * ((by.get(("native", *k)) or {}).get(f"{e}_eff") or 0) for k in keys]
        ax.barh([y + (i - 0.5) * h for y in range(len(keys))], vals, height=h, label=e)
    ax.set_yticks(range(len(keys)), [" ".join(k) for k in keys], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("% of machine limit (prefill: GEMM FLOP/s; decode: read bandwidth), native")
    ax.set_title("Efficiency against this machine's measured limits")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "peers_efficiency.png", dpi=120)
    plt.close(fig)
    return ["peers_ratio.png", "peers_efficiency.png"]


def main() -> None:
    out = Path(sys.argv[1])
    rows, weights, machines, timing = load(out)
    if not machines:
        sys.exit("report.py: no machine-*.json in " + str(out))
    limits = {k: max(m[k] for m in machines) for k in ("gemm_f32_gflops", "bw_read_gbs", "bw_copy_gbs", "bw_write_gbs")}
    lines = summarise(rows, weights, limits)
    (out / "peers.md").write_text(markdown(lines, weights, limits, machines, timing, rows))
    with open(out / "peers.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(lines[0].keys()))
        w.writeheader()
        w.writerows(lines)
    pngs = plots(lines, out)
    print(f"report.py: wrote {', '.join(str(out / n) for n in ['peers.md', 'peers.csv', *pngs])}", file=sys.stderr)


if __name__ == "__main__":
    main()
