#!/usr/bin/env bash
# `engine serve` against llama-server on the same weights, under the same load
# (`harness bench-serve`): concurrency levels 1, 4 and 16 by default, then `harness report`.
#
# Usage: bash ci/peers/serve.sh ENGINE_FOLDER GGUF [OUT_DIR]
#   ENGINE_FOLDER: the checkpoint folder engine serve runs (e.g. target/real/*-bf16);
#   GGUF:          the same weights for llama-server (e.g. made with llama-quantize
#                  --allow-requantize IN.gguf OUT.gguf BF16 from the GGUF the folder came from).
# Needs: target/release/{engine,harness} (cargo build --release) and llama-server, built by
# PEERS_LLAMA_SERVER=1 bash ci/peers/llama_cpp.sh (its path in $LLAMA_SERVER, or found there).
# Env: LEVELS (1,4,16), PROMPT_WORDS (128), MAX_TOKENS (64), THREADS (nproc), SLOTS (16).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# -ge 2 ] || { sed -n '2,12p' "$0"; exit 2; }
folder=$1 gguf=$2 out=${3:-$REPO/target/peers/serve}
LEVELS=${LEVELS:-1,4,16} PROMPT_WORDS=${PROMPT_WORDS:-128} MAX_TOKENS=${MAX_TOKENS:-64}
THREADS=${THREADS:-$(nproc)} SLOTS=${SLOTS:-16}
server=${LLAMA_SERVER:-$(ls "$REPO"/target/peers/build/*-server/bin/llama-server 2>/dev/null | tail -1)}
[ -x "$server" ] || { echo "no llama-server: PEERS_LLAMA_SERVER=1 bash ci/peers/llama_cpp.sh" >&2; exit 1; }
bin=$REPO/target/release
mkdir -p "$out"
rm -f "$out/bench-serve.jsonl"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

wait_up() {  # wait_up URL LOG
    for _ in $(seq 1 600); do
        curl -sf "$1/health" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    cat "$2" >&2
    echo "no server at $1" >&2
    exit 1
}

bench() {  # bench URL LABEL
    "$bin/harness" bench-serve --url "$1" --label "$2" --concurrency "$LEVELS" \
        --prompt-words "$PROMPT_WORDS" --max-tokens "$MAX_TOKENS" --out "$out/bench-serve.jsonl"
}

# One server at a time, so that each has the machine to itself.
"$bin/engine" serve --model "$folder" --port 18180 --max-concurrent "$SLOTS" \
    --max-queue 1024 2>"$out/engine.log" &
pids=($!)
wait_up http://127.0.0.1:18180 "$out/engine.log"
bench http://127.0.0.1:18180 engine
kill "${pids[0]}"; wait "${pids[0]}" || true

# Continuous batching over SLOTS slots of 1024 positions each, all threads.
"$server" -m "$gguf" --port 18181 -t "$THREADS" -tb "$THREADS" --parallel "$SLOTS" \
    -c $((SLOTS * 1024)) --cont-batching 2>"$out/llama-server.log" >/dev/null &
pids=($!)
wait_up http://127.0.0.1:18181 "$out/llama-server.log"
bench http://127.0.0.1:18181 llama-server
kill "${pids[0]}"; wait "${pids[0]}" || true

"$bin/harness" report "$out/bench-serve.jsonl" --out "$out/report"
