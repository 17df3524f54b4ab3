#!/usr/bin/env python3
"""The machine's own limits, measured in the same run as the benchmarks (docs/design.md §8):
a plain GEMM's FLOP/s (float32 matmul of numpy/OpenBLAS and torch/MKL, the better one, on the
benchmark's thread count)
and memory bandwidth (membw.c: best-of-8 read/copy/write over 1 GiB on the same threads).
Prints one JSON object with the CPU model, core count, flags of interest and both figures.

Usage: machine.py MEMBW_BINARY THREADS
"""
import json
import os
import platform
import subprocess
import sys
import time


def cpu_info() -> dict:
    model, flags = platform.processor(), set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model in ("", platform.processor()):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    want = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile"]
    return {"cpu": model, "cores": os.cpu_count(), "isa_flags": [f for f in want if f in flags]}


GEMM_CODE = {
    # numpy's float32 matmul (OpenBLAS in the PyPI wheel)
    "numpy": """
import numpy as np, time
a = np.random.default_rng(0).standard_normal((N, N), dtype=np.float32)
b = np.random.default_rng(1).standard_normal((N, N), dtype=np.float32)
mm = lambda: a @ b
""",
    # torch's float32 matmul (MKL/oneDNN), when the converter's torch is installed
    "torch": """
import torch, time
torch.set_num_threads(THREADS)
a = torch.randn(N, N); b = torch.randn(N, N)
mm = lambda: a @ b
""",
}
TIMER = """
mm(); best = 0.0
for _ in range(REPS):
    t = time.perf_counter(); mm(); t = time.perf_counter() - t
    best = max(best, 2 * N**3 / t)
print(best / 1e9)
"""


def gemm_flops(threads: int, n: int = 2048, reps: int = 7) -> dict:
    """Best-of-REPS float32 GEMM GFLOP/s from each library present; the peak is the best one.
    The BLAS reads its thread count from the environment at import, hence a child process."""
    env = dict(os.environ)
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    res = {}
    for lib, setup in GEMM_CODE.items():
        code = f"N, THREADS, REPS = {n}, {threads}, {reps}\n" + setup + TIMER
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if p.returncode == 0:
            res[f"gemm_f32_gflops_{lib}"] = round(float(p.stdout.strip()), 1)
    if not res:
        sys.exit("machine.py: no GEMM library (numpy or torch) could run")
    return {"gemm_f32_gflops": max(res.values()), "gemm_n": n, **res}


def membw(binary: str, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([binary, "1024"], env=env, check=True, capture_output=True, text=True)
    r = json.loads(out.stdout)
    return {"bw_read_gbs": r["read_gbs"], "bw_copy_gbs": r["copy_gbs"], "bw_write_gbs": r["write_gbs"]}


def main() -> None:
    binary, threads = sys.argv[1], int(sys.argv[2])
    t0 = time.time()
    info = {**cpu_info(), "threads": threads, **gemm_flops(threads), **membw(binary, threads)}
    info["measured_s"] = round(time.time() - t0, 1)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
