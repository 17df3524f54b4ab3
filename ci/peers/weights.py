#!/usr/bin/env python3
"""What one token costs each engine, read from the checkpoint files (no model code):

- flops_per_token: 2 x the element count of the matmul weights inside the decoder layers
  (attention/linear-attention projections and MLPs, from the bf16 safetensors header). The
  embedding lookup is free and prefill computes logits for the last token only, so the lm_head
  is left out; attention's own score/value FLOPs (a few % at 512-1024 tokens here) too.
- decode_bytes_per_token: the bytes a decode step must stream from memory: every tensor the
  forward pass reads (layers, final norm, lm_head) in the engine's own file, i.e. the file's
  tensors minus the MTP head (not run by either engine here) and minus the input embedding
  when an untied lm_head exists (a lookup reads one row; a tied one is read whole as lm_head).

Usage: weights.py OUT.json KEY=PATH ...   where KEY is ENGINE/MODEL/FORMAT and PATH a model
folder (ours: *.safetensors) or a .gguf file (llama.cpp). Prints nothing; writes OUT.json.
"""
import json
import struct
import sys
from pathlib import Path

ST_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "U8": 1, "I8": 1, "F64": 8, "I64": 8, "F8_E4M3": 1}


def safetensors_tensors(folder: Path) -> dict:
    """name -> (shape, bytes) from every *.safetensors header in the folder."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                out[name] = (t["shape"], t["data_offsets"][1] - t["data_offsets"][0])
    return out


def ours(folder: Path) -> dict:
    ts = {k: v for k, v in safetensors_tensors(folder).items() if not k.startswith("mtp.") and ".visual." not in k}
    has_lm_head = any("lm_head" in k for k in ts)
    total = 0
    flops = 0
    for name, (shape, nbytes) in ts.items():
        if has_lm_head and "embed_tokens" in name:
            continue
        total += nbytes
        # matmul weights of the decoder layers: 2-D `.weight` tensors under `layers.` (for
        # quantized folders the packed shape undercounts; flops come from the bf16 folder)
        if ".layers." in name and name.endswith(".weight") and len(shape) == 2:
            flops += 2 * shape[0] * shape[1]
    return {"decode_bytes_per_token": total, "flops_per_token": flops}


def llama(path: Path) -> dict:
    from gguf import GGUFReader  # the converter's own gguf-py

    r = GGUFReader(str(path))
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")

    def field(key, default=0):
        f = r.fields.get(f"{arch}.{key}")
        return int(f.parts[-1][0]) if f is not None else default

    n_run = field("block_count") - field("nextn_predict_layers")  # MTP/nextn blocks are not run
    names = {t.name for t in r.tensors}
    total = 0
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_run:
            continue
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        total += int(t.n_bytes)
    return {"decode_bytes_per_token": total, "gguf_type_counts": _type_counts(r, n_run)}


def _type_counts(r, n_run) -> dict:
    counts = {}
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_run:
            continue
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def main() -> None:
    out, result = Path(sys.argv[1]), {}
    for arg in sys.argv[2:]:
        key, path = arg.split("=", 1)
        p = Path(path)
        result[key] = llama(p) if p.suffix == ".gguf" else ours(p)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
