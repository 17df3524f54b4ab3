#!/usr/bin/env bash
# Peer benchmark on MLX: our `--backend mlx` against mlx-lm, on MLX's default device (the CPU
# here, the GPU on a Mac), on the same synthetic checkpoint folders, interleaved per model and
# format so drifts in machine load hit both alike.
#
# Usage: bash ci/peers/mlx.sh [OUT_DIR]      (default OUT_DIR: $PEERS_DIR/mlx-YYYYmmdd-HHMM)
#
# Ours runs `harness sweep --paths backend=mlx+numerics=N` for each N in $PEERS_MLX_NUMERICS
# (default `fast exact`): `fast` is the native path (weights in their stored dtype, activations
# in theirs: what mlx-lm does), `exact` the f32 path the goldens use. mlx-lm runs through
# ci/peers/mlx_lm_bench.py (plain mlx_lm.load, generate_step). Both link the same MLX: the
# harness is built against ci/mlx/setup.sh's mlx[cpu] wheel, and the mlx-lm venv pins that
# version. On Linux, MLX's CPU wheel carries the reference BLAS; Debian's OpenBLAS is preloaded
# into both sides when present (set PEERS_BLAS= to run without it), as its f32 GEMMs would
# otherwise take minutes per prompt. bf16 and quantized products on MLX's CPU device do not go
# through BLAS at all.
#
# Env: PEERS_DIR (target/peers), PEERS_MODELS (qwen3 qwen3_5), PEERS_FORMATS (bf16 q4),
# PEERS_MLX_LENGTHS (1,512; bf16), PEERS_MLX_QLENGTHS (1,128; quantized formats, whose products
# on MLX's CPU device run single-threaded reference loops taking minutes per prompt), PEERS_GEN (16), PEERS_REPEATS (1), PEERS_SIZE (bench),
# HARNESS_MLX (target/mlx/release/harness, built with --features mlx), PEERS_BLAS.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export PEERS_DIR=${PEERS_DIR:-$REPO/target/peers}
OUT=${1:-$PEERS_DIR/mlx-$(date +%Y%m%d-%H%M)}
REPEATS=${PEERS_REPEATS:-1}
MODELS=${PEERS_MODELS:-"qwen3 qwen3_5"}
FORMATS=${PEERS_FORMATS:-"bf16 q4"}
NUMERICS=${PEERS_MLX_NUMERICS:-"fast exact"}
LENGTHS=${PEERS_MLX_LENGTHS:-1,512}
QLENGTHS=${PEERS_MLX_QLENGTHS:-1,128}
GEN=${PEERS_GEN:-16}
SIZE=${PEERS_SIZE:-bench}
HARNESS=${HARNESS_MLX:-$REPO/target/mlx/release/harness}
BLAS=${PEERS_BLAS-/usr/lib/x86_64-linux-gnu/libopenblas.so.0}
MLX_VERSION=0.32.2 # ci/mlx/setup.sh's wheel: the MLX our harness links
log() { printf '[peers-mlx %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
T0=$SECONDS
[ -x "$HARNESS" ] || { echo "mlx.sh: no MLX harness at $HARNESS (see README, \"The MLX backend\": cargo build --release -p harness --features mlx with CARGO_TARGET_DIR=target/mlx; or set HARNESS_MLX)" >&2; exit 1; }
mkdir -p "$OUT/raw" "$PEERS_DIR/models"
OUT=$(realpath "$OUT")

# 1. mlx-lm in its own venv, pinned to the MLX our build links.
VENV=$PEERS_DIR/mlx-venv
if ! "$VENV/bin/python" -c "import matplotlib, mlx.core as mx, mlx_lm; assert mx.__version__ == '$MLX_VERSION'" 2>/dev/null; then
  log "creating $VENV (mlx[cpu]==$MLX_VERSION, mlx-lm==0.32.2)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "mlx[cpu]==$MLX_VERSION" mlx-lm==0.32.2 transformers==5.23.0 matplotlib
fi
PY=$VENV/bin/python
PRELOAD=()
if [ -n "$BLAS" ] && [ -e "$BLAS" ]; then
  PRELOAD=(LD_PRELOAD="$BLAS" OPENBLAS_NUM_THREADS=2)
else
  log "no OpenBLAS at '${BLAS}': MLX's f32 GEMMs use the wheel's reference BLAS (apt install libopenblas0-pthread)"
fi

# 2. Checkpoints (shared with run.sh): bf16 in the HF layout, quantized in mlx-lm's.
declare -A LAYOUT=([bf16]=hf [q4]=mlx [q8]=mlx)
for m in $MODELS; do
  for f in $FORMATS; do
    dir=$PEERS_DIR/models/$m-$SIZE-$f
    if [ ! -f "$dir/config.json" ]; then
      log "harness synth $m:$SIZE:$f"
      "$HARNESS" synth --family "$m" --size "$SIZE" --format "$f" --layout "${LAYOUT[$f]}" --out "$dir" --force >&2
    fi
  done
done
CONTEXT=$("$PY" - "$REPO" "$HARNESS" <<'PY'
import hashlib, json, os, platform, subprocess, sys
import mlx.core as mx
h = hashlib.sha256(open(sys.argv[2], "rb").read()).hexdigest()[:16]
git = lambda *a: subprocess.run(["git", "-C", sys.argv[1], *a], capture_output=True, text=True).stdout.strip()
commit = git("rev-parse", "--short", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
print(json.dumps({"machine": {"cpu": cpu, "cores": os.cpu_count()}, "commit": commit, "mlx": mx.__version__,
                  "device": str(mx.default_device()), "harness": {"path": sys.argv[2], "sha256_16": h}}))
PY
)

# 3. Interleaved runs.
ROWS=$OUT/peers-mlx.jsonl
for ((r = 0; r < REPEATS; r++)); do
  for m in $MODELS; do
    for f in $FORMATS; do
      dir=$PEERS_DIR/models/$m-$SIZE-$f
      lengths=$LENGTHS
      [ "$f" = bf16 ] || lengths=$QLENGTHS
      log "repeat $((r + 1))/$REPEATS $m $f: mlx-lm"
      raw=$OUT/raw/mlx-lm-$m-$f-r$r.jsonl
      rm -f "$raw"
      env "${PRELOAD[@]}" "$PY" "$HERE/mlx_lm_bench.py" --model "$dir" --lengths "$lengths" --gen "$GEN" --out "$raw" \
        >>"$OUT/raw/mlx-lm.stdout" 2>&1
      "$PY" "$HERE/rows.py" mlx_lm "$raw" "$ROWS" --isa mlx --model "$m" --format "$f" --repeat "$r" --context "$CONTEXT"
      for n in $NUMERICS; do
        log "repeat $((r + 1))/$REPEATS $m $f: ours mlx numerics=$n"
        raw=$OUT/raw/ours-$n-$m-$f-r$r.jsonl
        rm -f "$raw"
        env "${PRELOAD[@]}" "$HARNESS" sweep --model "$dir" --lengths "$lengths" --max-tokens "$GEN" --repeats 1 --max-repeats 1 \
          --warmup 0 --label "peers-mlx-$n" --paths "backend=mlx+numerics=$n" --out "$raw" >>"$OUT/raw/ours.stdout" 2>&1
        "$PY" "$HERE/rows.py" ours "$raw" "$ROWS" --isa "mlx+$n" --model "$m" --format "$f" --repeat "$r" --context "$CONTEXT"
      done
    done
  done
done
echo "{\"total_s\": $((SECONDS - T0)), \"repeats\": $REPEATS, \"gen\": $GEN, \"lengths\": \"bf16 $LENGTHS, quantized $QLENGTHS\", \"blas\": \"${BLAS}\"}" >"$OUT/timing.json"
"$PY" "$HERE/mlx_report.py" "$OUT"
log "done in $((SECONDS - T0)) s: $OUT/peers-mlx.md"
