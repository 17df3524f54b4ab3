#!/usr/bin/env bash
# The real-checkpoint stage: fetches and imports the pinned checkpoints (ci/real/fetch.sh), then
# checks the generation features on trained weights, where the synthetic ones cannot show a
# problem: chunked prefill, paged KV, batches and session reuse must give the plain path's
# greedy tokens (harness parity, 8 prompts of 9 to 257 tokens, 24 tokens each), and the
# end-to-end tests of harness/tests/harness/real_checkpoints.rs that need no reference run on
# each folder; a test that skips (prints E2E-SKIPPED) fails the stage.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
cargo build --release -p harness --bin harness --quiet
mapfile -t folders < <(bash ci/real/fetch.sh)
for dir in "${folders[@]}"; do
    echo "== real: $dir"
    target/release/harness parity --model "$dir" --a default --b kv=paged --max-tokens 24
    target/release/harness parity --model "$dir" --a default --b batch=4 --max-tokens 24
    target/release/harness parity --model "$dir" --a default --b session=reuse --max-tokens 24
    log="$(mktemp)"
    # The tests stage's package selection, so nothing is rebuilt.
    E2E_MODEL_DIR="$dir" cargo test --release --workspace --test harness -- --ignored \
        --nocapture real_checkpoints::prefill_in_pieces_matches_whole \
        real_checkpoints::gdn_per_step_matches_chunked 2>&1 | tee "$log"
    if grep -q "E2E-SKIPPED" "$log"; then
        echo "ci/real/test.sh: a real-checkpoint test skipped on $dir" >&2
        exit 1
    fi
done
