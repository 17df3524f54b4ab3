#!/usr/bin/env bash
# Creates harness/oracle/.venv with the pinned reference stack (mlx on CPU, mlx-lm, transformers).
# Safe to rerun: an existing venv is reused and brought to the pinned versions.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
if [ ! -x "$here/.venv/bin/python" ]; then
    "$python" -m venv "$here/.venv"
fi
"$here/.venv/bin/pip" install --quiet -r "$here/requirements.txt"
"$here/.venv/bin/python" - <<'PY'
import mlx.core as mx
mx.set_default_device(mx.cpu)
a = mx.array([1.0, 2.0, 3.0])
assert float((a * a).sum()) == 14.0, "mlx CPU smoke test failed"
import mlx_lm, transformers
print(f"oracle venv ready: mlx {mx.__version__} on {mx.default_device()}, "
      f"mlx-lm {mlx_lm.__version__}, transformers {transformers.__version__}")
PY
