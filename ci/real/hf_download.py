#!/usr/bin/env python3
"""Downloads a Hugging Face model repo at a revision into a folder (the files a checkpoint
folder needs), and prints the commit it resolved to on its last line.

Usage: hf_download.py REPO REVISION DIR. Reads HF_TOKEN (optional; gated repos need it).
Installs huggingface_hub into the running Python when it is missing (CI runners).
"""

import os
import subprocess
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    repo, revision, out = sys.argv[1:]
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "huggingface_hub==2.4.0"], check=True)
    from huggingface_hub import HfApi, snapshot_download

    token = os.environ.get("HF_TOKEN") or None
    sha = HfApi().model_info(repo, revision=revision, token=token).sha
    snapshot_download(
        repo,
        revision=sha,
        local_dir=out,
        token=token,
        allow_patterns=["*.json", "*.safetensors", "*.jinja", "tokenizer*"],
    )
    print(f"{repo} at {sha} in {out}", file=sys.stderr)
    print(sha)


if __name__ == "__main__":
    main()
