#!/usr/bin/env bash
# Writes a starting corpus per target into fuzz/seeds/ (git-ignored): a small valid file of
# each kind, taken from the mlx-lm-written fixture or made here.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fixture="$here/../engine/tests/fixtures/mlx-written/qwen3-bf16"
mkdir -p "$here"/seeds/{safetensors_header,config_json,chat_template,tokenizer_json}
cp "$fixture/config.json" "$here/seeds/config_json/qwen3.json"
cp "$fixture/tokenizer.json" "$here/seeds/tokenizer_json/bpe.json"
python3 - "$fixture/tokenizer_config.json" "$here/seeds" <<'PY'
import json, struct, sys
cfg = json.load(open(sys.argv[1]))
seeds = sys.argv[2]
open(f"{seeds}/chat_template/fixture.jinja", "w").write(cfg["chat_template"])
open(f"{seeds}/chat_template/loops.jinja", "w").write(
    "{% for m in messages %}{% if m.role == 'user' %}{{ m.content | upper }}{% endif %}{% endfor %}")
header = {"__metadata__": {"format": "pt"},
          "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
          "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
          "c": {"dtype": "U8", "shape": [2], "data_offsets": [22, 24]}}
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
open(f"{seeds}/safetensors_header/small.safetensors", "wb").write(
    struct.pack("<Q", len(h)) + h + bytes(range(24)))
PY
echo "seeds in $here/seeds"
