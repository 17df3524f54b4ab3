#!/usr/bin/env python3
"""Convert one of our Hugging Face-layout checkpoints (synthetic, or a real one our import
wrote) to GGUF with llama.cpp's own converter (the vendored convert_hf_to_gguf.py), unchanged
except for one thing:

The converter identifies a BPE pre-tokenizer by hashing the ids it gives for a fixed test text
and refuses unknown hashes. Our synthetic tokenizer.json has the real family's pre-tokenizer
regex but a synthetic vocabulary, so the hash is new. We tell it which pre-tokenizer the family
uses (the one llama.cpp maps the real checkpoint to). llama-bench feeds random token ids and
never tokenizes text, so this only affects metadata. An imported real checkpoint has the real
vocabulary, but our import writes its tokenizer files in its own form; naming the real model's
pre-tokenizer (`--pre smollm` for SmolLM2) keeps the converter from guessing.

Usage: convert.py LLAMA_CPP_SRC MODEL_DIR OUT.gguf [--pre NAME] [--outtype bf16]
"""
import argparse
import json
import runpy
import sys
from pathlib import Path

# model_type of config.json -> the name llama.cpp gives the real checkpoint's pre-tokenizer
PRE_BY_MODEL_TYPE = {"qwen3": "qwen2", "qwen3_5": "qwen35", "qwen3_5_moe": "qwen35"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path, help="llama.cpp source tree (holds convert_hf_to_gguf.py)")
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--pre", help="pre-tokenizer name (default: from config.json's model_type)")
    ap.add_argument("--outtype", default="bf16")
    args = ap.parse_args()

    model_type = json.loads((args.model / "config.json").read_text())["model_type"]
    pre = args.pre or PRE_BY_MODEL_TYPE.get(model_type)
    if pre is None:
        sys.exit(f"convert.py: no pre-tokenizer known for model_type {model_type!r}; pass --pre")

    sys.path.insert(0, str(args.src))
    sys.path.insert(1, str(args.src / "gguf-py"))
    import conversion  # noqa: E402  (the converter's package, imported once and shared with it)

    def known_pre(self, tokenizer) -> str:  # replaces TextModel.get_vocab_base_pre
        return pre

    conversion.TextModel.get_vocab_base_pre = known_pre
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".gguf.part")
    sys.argv = ["convert_hf_to_gguf.py", str(args.model), "--outtype", args.outtype, "--outfile", str(tmp)]
    runpy.run_path(str(args.src / "convert_hf_to_gguf.py"), run_name="__main__")
    tmp.rename(args.out)


if __name__ == "__main__":
    main()
