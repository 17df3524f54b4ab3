#!/usr/bin/env python3
"""Writes MLX's own quantize/dequantize outputs for small matrices into kernels/tests/fixtures/quant/.

kernels/tests/kernels/mlx_quant.rs reads them with no Python: our quantizer must reproduce MLX's packed
words, scales and biases byte for byte, and our dequantisation must match mx.dequantize(...,
dtype=float32) to within one f32 ulp.

Two files:
  quant.bin     every array, little-endian, back to back
  manifest.txt  one line per array group, whitespace-separated:
    input NAME ROWS COLS DTYPE OFFSET
        ROWS*COLS f32 values at OFFSET: the matrix as given to mx.quantize, widened exactly to f32
        (DTYPE says what mx.quantize actually saw: f32, or bf16 for values already bf16-rounded)
    case INPUT MODE BITS GROUP SCALE_DTYPE PACKED_OFF SCALES_OFF BIASES_OFF DEQUANT_OFF
        packed u32 [ROWS, COLS*BITS/32]; scales SCALE_DTYPE [ROWS, COLS/GROUP] (f32/bf16 for
        affine, the input's dtype; u8 codes for mxfp4/nvfp4/mxfp8); biases like scales, affine
        only ('-' otherwise); dequant f32 [ROWS, COLS] = mx.dequantize(..., dtype=float32) with
        affine scales/biases first cast to f32. Why the cast: given bf16 scales, mx.dequantize
        evaluates scale*q + bias in bf16 arithmetic (dtype=float32 only widens the rounded result),
        while our kernels and reference.py's float32 oracle widen scale and bias and work in f32.
Lines starting with '#' are comments.

Usage: .venv/bin/python make_quant_fixtures.py [--out DIR]
"""

import argparse
from pathlib import Path

import mlx.core as mx
import numpy as np

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "kernels/tests/fixtures/quant"

# (mode, bits, group): the brief's set plus the odd affine widths whose codes straddle u32 words.
SPECS = [
    ("affine", 4, 64),
    ("affine", 8, 32),
    ("affine", 4, 32),
    ("affine", 4, 128),
    ("affine", 2, 64),
    ("affine", 3, 64),
    ("affine", 5, 64),
    ("affine", 6, 64),
    ("mxfp4", 4, 32),
    ("nvfp4", 4, 16),
    ("mxfp8", 8, 32),
]


def tie_block() -> list[float]:
    """16 values for a group whose max |w| is 6, the largest E2M1 value: with an MX scale of 2^0 and
    an NV scale of exactly 1.0 the codes land on E2M1's midpoints, so round-half-to-even shows."""
    return [6.0, -0.25, 0.25, 0.75, -0.75, 1.25, 1.75, 2.5, -2.5, 3.5, 5.0, -5.0, 0.1, 0.0, -0.0, 4.5]


def matrices() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(99)
    a = np.empty((4, 128), np.float32)
    a[0] = rng.standard_normal(128)
    a[1] = 0.0  # all-zero row: scale must not divide by zero
    sign = np.where(rng.random(128) < 0.5, -1.0, 1.0)
    a[2] = sign * 10.0 ** rng.uniform(-4, 3, 128)  # large dynamic range inside every group
    a[3] = rng.standard_normal(128) * 1e-6  # tiny values: E4M3/E8M0 scales near underflow

    b = np.empty((3, 256), np.float32)
    b[0] = rng.standard_normal(256) * 0.02  # weight-like
    consts = [0.37, -1.5, 0.0, 2.0, -0.001, 100.0, 0.37, -0.37]
    b[1] = np.repeat(consts, 32)  # constant groups: max == min
    b[2] = np.tile(tie_block(), 16)
    b[2, 200:] += rng.standard_normal(56) * 3.0  # and some noisy groups after the exact ones
    return {"m4x128": a, "m3x256": b}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)

    blob = bytearray()
    lines = [
        f"# written by harness/oracle/make_quant_fixtures.py with mlx {mx.__version__} on CPU;",
        "# format described in that script's docstring",
    ]

    def put(arr: mx.array) -> int:
        off = len(blob)
        blob.extend(np.array(arr).tobytes() if arr.dtype != mx.bfloat16 else
                    np.array(arr.view(mx.uint16)).tobytes())
        return off

    for mname, m in matrices().items():
        for dtype, dname in ((mx.float32, "f32"), (mx.bfloat16, "bf16")):
            w = mx.array(m).astype(dtype)
            name = f"{mname}-{dname}"
            rows, cols = m.shape
            lines.append(f"input {name} {rows} {cols} {dname} {put(w.astype(mx.float32))}")
            for mode, bits, group in SPECS:
                out = mx.quantize(w, group_size=group, bits=bits, mode=mode)
                packed, scales = out[0], out[1]
                biases = out[2] if len(out) > 2 and out[2] is not None else None
                assert packed.dtype == mx.uint32 and packed.shape == (rows, cols * bits // 32)
                assert scales.shape == (rows, cols // group)
                sdt = {mx.float32: "f32", mx.bfloat16: "bf16", mx.uint8: "u8"}[scales.dtype]
                f32_scales = scales.astype(mx.float32) if mode == "affine" else scales
                f32_biases = None if biases is None else biases.astype(mx.float32)
                deq = mx.dequantize(packed, f32_scales, f32_biases, group_size=group, bits=bits,
                                    mode=mode, dtype=mx.float32)
                p_off, s_off = put(packed), put(scales)
                b_off = "-" if biases is None else str(put(biases))
                d_off = put(deq)
                lines.append(f"case {name} {mode} {bits} {group} {sdt} {p_off} {s_off} {b_off} {d_off}")

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quant.bin").write_bytes(bytes(blob))
    (args.out / "manifest.txt").write_text("\n".join(lines) + "\n")
    print(f"{args.out}: {len(lines) - 2} entries, quant.bin {len(blob)} bytes")


if __name__ == "__main__":
    main()
