"""Regenerates mlx_quant.txt: real `mx.quantize` outputs (MLX's CPU device) for inputs that
kernels/tests/quant.rs rebuilds bit for bit from the same integer generator.

    pip install "mlx[cpu]" numpy && python gen_mlx_quant.py > mlx_quant.txt
"""
import mlx.core as mx
import numpy as np

ROWS, COLS = 4, 128
MASK = (1 << 64) - 1


def lcg(seed):
    state = seed
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) & MASK
        yield state >> 33


def inputs(seed):
    """Four row kinds: uniform, tie-heavy sixteenths, zero group + tiny values, wide range."""
    g = lcg(seed)
    out = np.zeros((ROWS, COLS), dtype=np.float32)
    for r in range(ROWS):
        for c in range(COLS):
            kind = r % 4
            if kind == 0:
                v = ((next(g) & 0xFFFFFF) / 2.0**24 - 0.5) * 4.0
            elif kind == 1:
                v = ((next(g) % 129) - 64) / 16.0
            elif kind == 2:
                v = 0.0 if c < 32 else ((next(g) % 2001) - 1000) * 2.0**-20
            else:
                u = (next(g) & 0xFFFFFF) / 2.0**24 - 0.5
                v = u * 2.0 ** ((next(g) % 24) - 12)
            out[r, c] = v
    return out


CASES = [("affine", b, g, "f32") for b in (2, 3, 4, 5, 6, 8) for g in (32, 64, 128)]
CASES += [("affine", 4, 64, d) for d in ("bf16", "f16")]
CASES += [("affine", 8, 32, d) for d in ("bf16", "f16")]
CASES += [(m, None, None, d) for m in ("mxfp4", "nvfp4", "mxfp8") for d in ("f32", "bf16", "f16")]
DT = {"f32": mx.float32, "bf16": mx.bfloat16, "f16": mx.float16}

print(f"# mx.quantize outputs, mlx {mx.__version__}, device {mx.default_device()}, {ROWS}x{COLS}")
for i, (mode, bits, group, dt) in enumerate(CASES):
    seed = 1000 + i
    w = mx.array(inputs(seed)).astype(DT[dt])
    if mode == "affine":
        res = mx.quantize(w, group_size=group, bits=bits, mode=mode)
    else:
        res = mx.quantize(w, mode=mode)
    mx.eval(res)
    print(f"case {mode} {bits or 0} {group or 0} {dt} {seed}")
    names = ["packed", "scales", "biases"]
    for name, a in zip(names, res):
        raw = np.array(a.view(mx.uint16) if a.dtype in (mx.bfloat16, mx.float16) else a)
        print(name, raw.tobytes().hex())
