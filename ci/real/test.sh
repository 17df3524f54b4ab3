#!/usr/bin/env bash
# The real-checkpoint stage: fetches and imports the pinned checkpoints (ci/real/fetch.sh), then
#  - against the committed references (goldens/real/KEY.json: transformers in f32 reading the
#    same GGUF file, or for the quantized folders KEY-q4 and KEY-q8 mlx-lm in f32): on the
#    folder KEY, the engine's tokenizer and chat template give the reference's prompt ids, and
#    its greedy tokens and its top-1 and top-5 log-probs follow the reference's within 1e-3
#    (exact numerics); in fast numerics, on the bf16 folder KEY-bf16, within the bounds
#    real_checkpoints.rs states. Every reference must have its
#    folder: one without fails the stage.
#  - on the bf16 folders (the import's default dtype), the generation features on trained
#    weights: chunked prefill, paged KV, batches and session reuse give the plain path's greedy
#    tokens (harness parity, 8 prompts of 9 to 257 tokens, 24 tokens each).
#  - the real vocabularies and chat templates fetch.sh keeps in target/real/vocab/: our
#    tokenization and rendering against Hugging Face's (real_tokenizers.rs).
# A real_checkpoints test that skips (prints E2E-SKIPPED) fails the stage.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
cargo build --release -p harness --bin harness --quiet
mapfile -t folders < <(bash ci/real/fetch.sh)

# ignored TEST...: the named ignored tests of the harness test binary, failing on a skip. The
# tests stage's package selection (--workspace), so nothing is rebuilt.
ignored() {
    local log
    log="$(mktemp)"
    cargo test --release --workspace --test harness \
        -- --ignored --nocapture --exact --test-threads 1 "$@" 2>&1 | tee "$log"
    if grep -q "E2E-SKIPPED" "$log"; then
        echo "ci/real/test.sh: a real-checkpoint test skipped" >&2
        exit 1
    fi
    rm -f "$log"
}

# e2e DIR KEY TEST...: the named real_checkpoints tests on DIR.
e2e() {
    local dir="$1" key="$2"
    shift 2
    E2E_MODEL_DIR="$dir" E2E_MODEL_KEY="$key" ignored "${@/#/real_checkpoints::}"
}

echo "== real: Qwen2 and Llama 3 vocabularies, chat templates (target/real/vocab)"
ignored real_tokenizers::vocabularies_give_llama_cpp_recorded_ids \
    real_tokenizers::vocabularies_match_transformers \
    real_tokenizers::chat_templates_render_as_transformers

for reference in goldens/real/*.json; do
    key="$(basename "$reference" .json)"
    dir=""
    for d in "${folders[@]}"; do
        [ "$(basename "$d")" = "$key" ] && dir="$d"
    done
    if [ -z "$dir" ]; then
        echo "ci/real/test.sh: $reference has no fetched folder $key (ci/real/fetch.sh)" >&2
        exit 1
    fi
    echo "== real: $key against $reference"
    e2e "$dir" "$key" references_match
    case "$key" in
    *-q4 | *-q8) ;; # fast on 4-bit parts from the reference within 1-4 tokens (docs/families.md)
    *)
        echo "== real: $key-bf16 (fast numerics) against $reference"
        e2e "$dir-bf16" "$key" references_match_fast
        ;;
    esac
done

for dir in "${folders[@]}"; do
    [[ "$dir" == *-bf16 ]] || continue
    echo "== real: $dir"
    target/release/harness parity --model "$dir" --a default --b kv=paged --max-tokens 24
    target/release/harness parity --model "$dir" --a default --b batch=4 --max-tokens 24
    target/release/harness parity --model "$dir" --a default --b session=reuse --max-tokens 24
    e2e "$dir" "$(basename "$dir")" prefill_in_pieces_matches_whole gdn_per_step_matches_chunked
done
