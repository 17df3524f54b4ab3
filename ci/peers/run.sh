#!/usr/bin/env bash
# Peer benchmark on CPU: our engine against llama.cpp on the same synthetic checkpoints.
#
# Usage: bash ci/peers/run.sh [OUT_DIR]      (default OUT_DIR: $PEERS_DIR/out-YYYYmmdd-HHMM)
# See docs/peers.md for what is measured, the env vars and the caveats.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export PEERS_DIR=${PEERS_DIR:-$REPO/target/peers}
OUT=${1:-$PEERS_DIR/out-$(date +%Y%m%d-%H%M)}
REPEATS=${PEERS_REPEATS:-3}
THREADS=${PEERS_THREADS:-2}
MODELS=${PEERS_MODELS:-"qwen3 qwen3_5"}
FORMATS=${PEERS_FORMATS:-"bf16 q4 q8"}
NUMERICS=${PEERS_NUMERICS:-"exact fast"}
LENGTHS=${PEERS_LENGTHS:-512,1024}
GEN=${PEERS_GEN:-32}
DEPTH=${PEERS_DEPTH:-512}
SIZE=${PEERS_SIZE:-bench}
HARNESS=${HARNESS:-$REPO/target/release/harness}
log() { printf '[peers %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
T0=$SECONDS
[ -x "$HARNESS" ] || { echo "run.sh: no harness at $HARNESS (cargo build --release -p harness, or set HARNESS)" >&2; exit 1; }
mkdir -p "$OUT/raw" "$PEERS_DIR/models" "$PEERS_DIR/gguf" "$PEERS_DIR/tools"
HARNESS=$(realpath "$HARNESS"); OUT=$(realpath "$OUT"); PEERS_DIR=$(realpath "$PEERS_DIR")

# 1. llama.cpp: sdist, venv, two builds (cached).
bash "$HERE/llama_cpp.sh"
# shellcheck disable=SC1091
source "$PEERS_DIR/llama_cpp.env"
PY=$PEERS_DIR/venv/bin/python
T_SETUP=$((SECONDS - T0))

# 2. Checkpoints: ours from `harness synth` (deterministic), llama.cpp's converted from our
#    bf16 folder and quantized by llama-quantize. Cached by name; delete $PEERS_DIR/models
#    and $PEERS_DIR/gguf after changing the synthesiser.
declare -A QTYPE=([bf16]=BF16 [q4]=Q4_0 [q8]=Q8_0)
declare -A LAYOUT=([bf16]=hf [q4]=mlx [q8]=mlx)
W_ARGS=()
for m in $MODELS; do
  for f in bf16 $FORMATS; do
    dir=$PEERS_DIR/models/$m-$SIZE-$f
    if [ ! -f "$dir/config.json" ]; then
      log "harness synth $m:$SIZE:$f"
      "$HARNESS" synth --family "$m" --size "$SIZE" --format "$f" --layout "${LAYOUT[$f]}" --out "$dir" --force >&2
    fi
    W_ARGS+=("ours/$m/$f=$dir")
  done
  bf16_gguf=$PEERS_DIR/gguf/$m-$SIZE-BF16.gguf
  if [ ! -f "$bf16_gguf" ]; then
    log "convert_hf_to_gguf $m -> $bf16_gguf"
    "$PY" "$HERE/convert.py" "$LLAMA_CPP_SRC" "$PEERS_DIR/models/$m-$SIZE-bf16" "$bf16_gguf" \
      >"$PEERS_DIR/logs/convert-$m.log" 2>&1 || { tail -20 "$PEERS_DIR/logs/convert-$m.log" >&2; exit 1; }
  fi
  for f in $FORMATS; do
    g=$PEERS_DIR/gguf/$m-$SIZE-${QTYPE[$f]}.gguf
    if [ ! -f "$g" ]; then
      log "llama-quantize $m ${QTYPE[$f]}"
      "$LLAMA_BIN_NATIVE/llama-quantize" "$bf16_gguf" "$g.part" "${QTYPE[$f]}" "$THREADS" \
        >"$PEERS_DIR/logs/quantize-$m-$f.log" 2>&1 && mv "$g.part" "$g"
    fi
    W_ARGS+=("llama.cpp/$m/$f=$g")
  done
done
"$PY" "$HERE/weights.py" "$OUT/weights.json" "${W_ARGS[@]}"
T_MODELS=$((SECONDS - T0 - T_SETUP))

# 3. The machine's limits, measured now and again at the end (the report uses the best).
[ -x "$PEERS_DIR/tools/membw" ] && [ "$PEERS_DIR/tools/membw" -nt "$HERE/membw.c" ] \
  || cc -O3 -march=native -fopenmp "$HERE/membw.c" -o "$PEERS_DIR/tools/membw"
log "measuring peak GEMM FLOP/s and memory bandwidth"
"$PY" "$HERE/machine.py" "$PEERS_DIR/tools/membw" "$THREADS" >"$OUT/machine-start.json"
cat "$OUT/machine-start.json" >&2
# The harness records the commit its source checkout has when it runs, which is not always the
# one it was built from; the binary's hash and build time say which binary ran.
CONTEXT=$("$PY" - "$OUT/machine-start.json" "$REPO" "$HARNESS" <<'PY'
import hashlib, json, os, subprocess, sys, time
m = json.load(open(sys.argv[1]))
h = hashlib.sha256(open(sys.argv[3], "rb").read()).hexdigest()[:16]
built = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(os.path.getmtime(sys.argv[3])))
git = lambda *a: subprocess.run(["git", "-C", sys.argv[2], *a], capture_output=True, text=True).stdout.strip()
commit = git("rev-parse", "--short", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
print(json.dumps({"machine": {k: m[k] for k in ("cpu", "cores", "isa_flags")}, "threads": m["threads"], "commit": commit,
                  "harness": {"path": sys.argv[3], "sha256_16": h, "built_utc": built}}))
PY
)

# 4. The benchmark. Each repetition runs every model/format and, inside it, llama.cpp native,
#    llama.cpp AVX2, ours native and ours AVX2-capped back to back, so that drifts in machine
#    load (2 cores, shared) hit all four alike.
ROWS=$OUT/peers.jsonl
llama() {  # llama ISA BIN MODEL FORMAT REPEAT GGUF
  local isa=$1 bin=$2 m=$3 f=$4 r=$5 g=$6
  local raw=$OUT/raw/llama-$isa-$m-$f-r$r.jsonl
  # Prefill at each length and decode from an empty context, then decode after DEPTH tokens
  # (a second call: -d applies to every test of a call). llama-bench warms up once per call.
  "$bin/llama-bench" -m "$g" -t "$THREADS" -p "$LENGTHS" -n "$GEN" -r 1 -o jsonl >"$raw" 2>>"$OUT/raw/llama.stderr"
  "$bin/llama-bench" -m "$g" -t "$THREADS" -p 0 -n "$GEN" -d "$DEPTH" -r 1 -o jsonl >>"$raw" 2>>"$OUT/raw/llama.stderr"
  "$PY" "$HERE/rows.py" llama "$raw" "$ROWS" --isa "$isa" --model "$m" --format "$f" --repeat "$r" --context "$CONTEXT"
}
ours() {  # ours ISA MODEL FORMAT REPEAT NUMERICS  (native: ENGINE_CPU_ISA unset; else ENGINE_CPU_ISA=ISA)
  local isa=$1 m=$2 f=$3 r=$4 n=${5:-exact}
  local raw=$OUT/raw/ours-$isa-$n-$m-$f-r$r.jsonl lengths cap label=$isa
  # `fast` numerics (int8 activations against 4-bit weights, bf16 against bf16) are rows of
  # their own, ISA `native+fast` / `avx2+fast`, paired with the same llama.cpp build.
  [ "$n" = exact ] || label=$isa+$n
  if [ "$isa" = native ]; then cap=(-u ENGINE_CPU_ISA); else cap=(ENGINE_CPU_ISA="$isa"); fi
  # A 1-token prompt gives decode from an (almost) empty context, like llama-bench's tgN;
  # the DEPTH-token prompt gives decode@DEPTH.
  lengths=$(printf '%s\n' 1 ${LENGTHS//,/ } "$DEPTH" | sort -nu | paste -sd,)
  rm -f "$raw"
  env "${cap[@]}" RAYON_NUM_THREADS="$THREADS" "$HARNESS" sweep --model "$PEERS_DIR/models/$m-$SIZE-$f" \
    --lengths "$lengths" --max-tokens "$GEN" --repeats 1 --max-repeats 1 --warmup 0 --label "peers-$label" --paths "numerics=$n" --out "$raw" \
    >>"$OUT/raw/ours.stdout" 2>&1
  "$PY" "$HERE/rows.py" ours "$raw" "$ROWS" --isa "$label" --model "$m" --format "$f" --repeat "$r" --context "$CONTEXT"
}
T_BENCH0=$SECONDS
for ((r = 0; r < REPEATS; r++)); do
  for m in $MODELS; do
    for f in $FORMATS; do
      g=$PEERS_DIR/gguf/$m-$SIZE-${QTYPE[$f]}.gguf
      log "repeat $((r + 1))/$REPEATS $m $f: llama.cpp native"; llama native "$LLAMA_BIN_NATIVE" "$m" "$f" "$r" "$g"
      log "repeat $((r + 1))/$REPEATS $m $f: llama.cpp avx2";   llama avx2 "$LLAMA_BIN_AVX2" "$m" "$f" "$r" "$g"
      for n in $NUMERICS; do
        log "repeat $((r + 1))/$REPEATS $m $f: ours native $n"; ours native "$m" "$f" "$r" "$n"
        log "repeat $((r + 1))/$REPEATS $m $f: ours avx2 $n";   ours avx2 "$m" "$f" "$r" "$n"
      done
    done
  done
done
T_BENCH=$((SECONDS - T_BENCH0))
"$PY" "$HERE/machine.py" "$PEERS_DIR/tools/membw" "$THREADS" >"$OUT/machine-end.json"

# 5. Report.
cat >"$OUT/timing.json" <<JSON
{"setup_s": $T_SETUP, "models_s": $T_MODELS, "bench_s": $T_BENCH, "total_s": $((SECONDS - T0)), "repeats": $REPEATS,
 "llama_cpp_python": "$LLAMA_CPP_PY_VERSION", "threads": $THREADS}
JSON
"$PY" "$HERE/report.py" "$OUT"
log "done in $((SECONDS - T0)) s: $OUT/peers.md"
