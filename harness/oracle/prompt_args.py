#!/usr/bin/env python3
"""reference.py's prompt arguments from prompts.json, one per line (for bash's mapfile).

  prompt_args.py short   the short id prompts, then the chat messages (Qwen3 references)
  prompt_args.py long    the short and long id prompts, then the chat messages (Qwen3.5, LFM2)
  prompt_args.py ids     the short and long id prompts only (synthetic references)
"""
import json
import sys
from pathlib import Path

mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode not in ("short", "long", "ids"):
    sys.exit(__doc__)
p = json.loads((Path(__file__).parent / "prompts.json").read_text())
for ids in p["prompt_ids"] + (p["long_prompt_ids"] if mode != "short" else []):
    print("--prompt-ids")
    print(",".join(map(str, ids)))
if mode != "ids":
    for msg in p["chat"]:
        print("--chat")
        print(msg)
