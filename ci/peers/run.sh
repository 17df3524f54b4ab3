#!/usr/bin/env bash
# Peer benchmark on CPU: our engine against llama.cpp on the same checkpoints: synthetic Qwen3
# and Qwen3.5 at the bench widths, and the real SmolLM2-135M-Instruct (ci/real/fetch.sh).
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
MODELS=${PEERS_MODELS:-"qwen3 qwen3_5 smollm2"}
FORMATS=${PEERS_FORMATS:-"bf16 q4 q8"}
# `default` is what a user who passes no --numerics gets (engine info says which, per format).
NUMERICS=${PEERS_NUMERICS:-"default exact"}
LENGTHS=${PEERS_LENGTHS:-512,1024}
GEN=${PEERS_GEN:-32}
DEPTH=${PEERS_DEPTH:-512}
SIZE=${PEERS_SIZE:-bench}
HARNESS=${HARNESS:-$REPO/target/release/harness}
ENGINE=${ENGINE:-$REPO/target/release/engine}
log() { printf '[peers %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
T0=$SECONDS
[ -x "$HARNESS" ] || { echo "run.sh: no harness at $HARNESS (cargo build --release -p harness, or set HARNESS)" >&2; exit 1; }
[ -x "$ENGINE" ] || { echo "run.sh: no engine at $ENGINE (cargo build --release -p engine, or set ENGINE)" >&2; exit 1; }
mkdir -p "$OUT/raw" "$PEERS_DIR/models" "$PEERS_DIR/gguf" "$PEERS_DIR/tools"
HARNESS=$(realpath "$HARNESS"); OUT=$(realpath "$OUT"); PEERS_DIR=$(realpath "$PEERS_DIR")

# 1. llama.cpp: sdist, venv, two builds (cached).
bash "$HERE/llama_cpp.sh"
# shellcheck disable=SC1091
source "$PEERS_DIR/llama_cpp.env"
PY=$PEERS_DIR/venv/bin/python
# Instruction-set caps to run: native, plus AVX2-capped where that differs (llama_cpp.sh builds
# the capped llama.cpp only on hosts with AVX-512).
ISAS=${PEERS_ISAS:-native${LLAMA_BIN_AVX2:+ avx2}}
if [[ " $ISAS " == *" avx2 "* ]] && [ -z "$LLAMA_BIN_AVX2" ]; then
  echo "run.sh: PEERS_ISAS asks for avx2 rows, but no AVX2-capped llama.cpp was built (PEERS_LLAMA_AVX2=1 builds it)" >&2
  exit 1
fi
T_SETUP=$((SECONDS - T0))

# 2. Checkpoints, per model and format: ours (OURS) and llama.cpp's (GGUF), with the names of
#    their encodings (OURS_W, LLAMA_W). Cached by name; delete $PEERS_DIR/models and
#    $PEERS_DIR/gguf after changing the synthesiser.
#    - Synthetic (qwen3, qwen3_5): ours from `harness synth` (deterministic); llama.cpp's
#      converted from our bf16 folder and quantized by llama-quantize.
#    - smollm2 (real, SmolLM2-135M-Instruct): llama.cpp reads the package's own Q4_1 GGUF as
#      it ships; ours reads its import (ci/real/fetch.sh) quantized the same way where our
#      format can (affine 4-bit, groups of 32, one scale and one offset per group: 5 bits per
#      weight either way). bf16 is the import on both sides (converted to GGUF); 8-bit is
#      llama.cpp's Q8_0 (symmetric) against our affine groups of 32.
declare -A QTYPE=([bf16]=BF16 [q4]=Q4_0 [q8]=Q8_0)
declare -A LAYOUT=([bf16]=hf [q4]=mlx [q8]=mlx)
declare -A OURS GGUF OURS_W LLAMA_W
W_ARGS=()
llama_gguf() {  # llama_gguf MODEL NAME BF16_DIR PRE: the BF16 GGUF of our folder, then llama-quantize's
  local m=$1 name=$2 dir=$3 pre=$4 f g bf16_gguf=$PEERS_DIR/gguf/$2-BF16.gguf
  if [ ! -f "$bf16_gguf" ]; then
    log "convert_hf_to_gguf $m -> $bf16_gguf"
    "$PY" "$HERE/convert.py" "$LLAMA_CPP_SRC" "$dir" "$bf16_gguf" ${pre:+--pre "$pre"} \
      >"$PEERS_DIR/logs/convert-$m.log" 2>&1 || { tail -20 "$PEERS_DIR/logs/convert-$m.log" >&2; exit 1; }
  fi
  for f in $FORMATS; do
    [ -z "${GGUF[$m/$f]:-}" ] || continue
    g=$PEERS_DIR/gguf/$name-${QTYPE[$f]}.gguf
    [ "$f" = bf16 ] && g=$bf16_gguf
    if [ ! -f "$g" ]; then
      log "llama-quantize $m ${QTYPE[$f]}"
      "$LLAMA_BIN_NATIVE/llama-quantize" "$bf16_gguf" "$g.part" "${QTYPE[$f]}" "$THREADS" \
        >"$PEERS_DIR/logs/quantize-$m-$f.log" 2>&1 && mv "$g.part" "$g"
    fi
    GGUF[$m/$f]=$g
    LLAMA_W[$m/$f]=${QTYPE[$f]}
  done
}
for m in $MODELS; do
  if [ "$m" = smollm2 ]; then
    real=$(bash "$REPO/ci/real/fetch.sh" | grep '/smollm2-135m-instruct-q4_1-bf16$') \
      || { echo "run.sh: ci/real/fetch.sh gave no SmolLM2 bf16 folder" >&2; exit 1; }
    OURS[$m/bf16]=$real; OURS_W[$m/bf16]=bf16
    for f in $FORMATS; do
      [ "$f" = bf16 ] && continue
      bits=${f#q} dir=$PEERS_DIR/models/$m-$f-g32
      if [ ! -f "$dir/model.safetensors" ]; then
        log "harness quantize $m: $bits bits, groups of 32"
        rm -rf "$dir"
        "$HARNESS" quantize "$real" "$dir" --bits "$bits" --group-size 32 >&2
      fi
      OURS[$m/$f]=$dir; OURS_W[$m/$f]="affine q$bits g32 (bf16 scales, offsets)"
    done
    if [[ " $FORMATS " == *" q4 "* ]]; then
      GGUF[$m/q4]=${REAL_CACHE:-$REPO/target/real}/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
      LLAMA_W[$m/q4]="Q4_1 (the package's file)"
    fi
    llama_gguf "$m" "$m" "$real" smollm
  else
    for f in bf16 $FORMATS; do
      dir=$PEERS_DIR/models/$m-$SIZE-$f
      if [ ! -f "$dir/config.json" ]; then
        log "harness synth $m:$SIZE:$f"
        "$HARNESS" synth --family "$m" --size "$SIZE" --format "$f" --layout "${LAYOUT[$f]}" --out "$dir" --force >&2
      fi
      OURS[$m/$f]=$dir
    done
    OURS_W[$m/bf16]=bf16; OURS_W[$m/q4]="MLX affine q4 g64"; OURS_W[$m/q8]="MLX affine q8 g32"
    llama_gguf "$m" "$m-$SIZE" "${OURS[$m/bf16]}" ""
  fi
  for f in $FORMATS; do
    W_ARGS+=("ours/$m/$f=${OURS[$m/$f]}" "llama.cpp/$m/$f=${GGUF[$m/$f]}")
  done
  # The bf16 folder gives the model's FLOPs per token (report.py), whatever FORMATS holds.
  [[ " $FORMATS " == *" bf16 "* ]] || W_ARGS+=("ours/$m/bf16=${OURS[$m/bf16]}")
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

# 4. The benchmark. Each repetition runs every model/format and, inside it, llama.cpp and ours
#    per ISA back to back (native, and AVX2-capped where that differs), so that drifts in
#    machine load (2 cores, shared) hit all alike.
ROWS=$OUT/peers.jsonl
llama() {  # llama ISA BIN MODEL FORMAT REPEAT
  local isa=$1 bin=$2 m=$3 f=$4 r=$5 g=${GGUF[$3/$4]}
  local raw=$OUT/raw/llama-$isa-$m-$f-r$r.jsonl
  # Prefill at each length and decode from an empty context, then decode after DEPTH tokens
  # (a second call: -d applies to every test of a call). llama-bench warms up once per call.
  "$bin/llama-bench" -m "$g" -t "$THREADS" -p "$LENGTHS" -n "$GEN" -r 1 -o jsonl >"$raw" 2>>"$OUT/raw/llama.stderr"
  "$bin/llama-bench" -m "$g" -t "$THREADS" -p 0 -n "$GEN" -d "$DEPTH" -r 1 -o jsonl >>"$raw" 2>>"$OUT/raw/llama.stderr"
  "$PY" "$HERE/rows.py" llama "$raw" "$ROWS" --isa "$isa" --model "$m" --format "$f" --repeat "$r" \
    --weights "${LLAMA_W[$m/$f]}" --context "$CONTEXT"
}
# The numerics `default` stands for, per model and format: what engine info says a CPU run
# without --numerics gets.
declare -A DEFAULT_NUMERICS
for m in $MODELS; do
  for f in $FORMATS; do
    DEFAULT_NUMERICS[$m/$f]=$("$ENGINE" info --model "${OURS[$m/$f]}" --json |
      "$PY" -c 'import json, sys; print(json.load(sys.stdin)["default_numerics"]["cpu"])')
    log "$m $f: default numerics on the CPU: ${DEFAULT_NUMERICS[$m/$f]}"
  done
done
ours() {  # ours ISA MODEL FORMAT REPEAT  (native: ENGINE_CPU_ISA unset; else ENGINE_CPU_ISA=ISA)
  local isa=$1 m=$2 f=$3 r=$4 n num raw lengths cap label
  declare -A ran=()
  if [ "$isa" = native ]; then cap=(-u ENGINE_CPU_ISA); else cap=(ENGINE_CPU_ISA="$isa"); fi
  # A 1-token prompt gives decode from an (almost) empty context, like llama-bench's tgN;
  # the DEPTH-token prompt gives decode@DEPTH.
  lengths=$(printf '%s\n' 1 ${LENGTHS//,/ } "$DEPTH" | sort -nu | paste -sd,)
  for n in $NUMERICS; do
    # Rows of the defaults carry the bare ISA (`native`); other numerics are rows of their own
    # (`native+exact`, `native+fast`), paired with the same llama.cpp build. Numerics that
    # the default already ran are not run twice: their rows share its measurement.
    num=$n label=$isa
    if [ "$n" = default ]; then num=${DEFAULT_NUMERICS[$m/$f]}; else label=$isa+$n; fi
    raw=${ran[$num]:-}
    if [ -z "$raw" ]; then
      raw=$OUT/raw/ours-$isa-$num-$m-$f-r$r.jsonl
      log "repeat $((r + 1))/$REPEATS $m $f: ours $isa $num"
      rm -f "$raw"
      env "${cap[@]}" RAYON_NUM_THREADS="$THREADS" "$HARNESS" sweep --model "${OURS[$m/$f]}" \
        --lengths "$lengths" --max-tokens "$GEN" --repeats 1 --max-repeats 1 --warmup 0 --label "peers-$isa-$num" \
        --paths "numerics=$num" --out "$raw" >>"$OUT/raw/ours.stdout" 2>&1
      ran[$num]=$raw
    fi
    "$PY" "$HERE/rows.py" ours "$raw" "$ROWS" --isa "$label" --model "$m" --format "$f" --repeat "$r" \
      --weights "${OURS_W[$m/$f]}" --numerics "$num" --context "$CONTEXT"
  done
}
T_BENCH0=$SECONDS
for ((r = 0; r < REPEATS; r++)); do
  for m in $MODELS; do
    for f in $FORMATS; do
      for isa in $ISAS; do
        bin=$LLAMA_BIN_NATIVE
        [ "$isa" = native ] || bin=$LLAMA_BIN_AVX2
        log "repeat $((r + 1))/$REPEATS $m $f: llama.cpp $isa"; llama "$isa" "$bin" "$m" "$f" "$r"
        ours "$isa" "$m" "$f" "$r"
      done
    done
  done
done
T_BENCH=$((SECONDS - T_BENCH0))
"$PY" "$HERE/machine.py" "$PEERS_DIR/tools/membw" "$THREADS" >"$OUT/machine-end.json"

# 5. Report.
cat >"$OUT/timing.json" <<JSON
{"setup_s": $T_SETUP, "models_s": $T_MODELS, "bench_s": $T_BENCH, "total_s": $((SECONDS - T0)), "repeats": $REPEATS,
 "isas": "$ISAS", "numerics": "$NUMERICS", "llama_cpp_python": "$LLAMA_CPP_PY_VERSION", "threads": $THREADS}
JSON
"$PY" "$HERE/report.py" "$OUT"
log "done in $((SECONDS - T0)) s: $OUT/peers.md"
