#!/usr/bin/env bash
# The `serve` stage: `engine serve` on a synthetic checkpoint, driven by the official `openai`
# Python client (ci/serve/client.py; pinned in ci/serve/requirements.txt, installed into
# target/serve-venv): chat and text completions whole and streamed, concurrent requests equal
# to `engine generate`, a stream cancelled midway, bad requests answered 4xx, /metrics parsed
# by prometheus_client. Then SIGTERM must end the server with status 0.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
venv="$CARGO_TARGET_DIR/serve-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r ci/serve/requirements.txt

cargo build --release --quiet -p engine -p harness
bin="$CARGO_TARGET_DIR/release"
work="$CARGO_TARGET_DIR/serve-stage"
rm -rf "$work"
mkdir -p "$work"
"$bin/harness" synth --family qwen3 --size tiny --format bf16 --seed 3 --out "$work/model" >/dev/null

"$bin/engine" serve --model "$work/model" --port 0 --max-concurrent 8 2>"$work/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
url=""
for _ in $(seq 1 200); do
    url=$(grep -o 'http://[0-9.:]*' "$work/server.log" | head -1 || true)
    [ -n "$url" ] && break
    kill -0 "$server" 2>/dev/null || { cat "$work/server.log"; echo "engine serve exited" >&2; exit 1; }
    sleep 0.1
done
[ -n "$url" ] || { cat "$work/server.log"; echo "engine serve did not start" >&2; exit 1; }

"$venv/bin/python" ci/serve/client.py "$url" "$bin/engine" "$work/model"

# The load generator and its report, end to end: every request must finish with exactly
# max_tokens tokens (ignore_eos), and the report must hold both levels.
"$bin/harness" bench-serve --url "$url" --concurrency 1,4 --requests 8 --prompt-words 16 \
    --max-tokens 8 --warmup 1 --label engine --out "$work/bench.jsonl"
"$bin/harness" report "$work/bench.jsonl" --out "$work/report"
"$venv/bin/python" - "$work/bench.jsonl" "$work/report/serve.csv" <<'PY'
import csv, json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
assert len(records) == 16, len(records)
bad = [r for r in records if r["error"] or r["completion_tokens"] != 8 or r["ttft_ms"] <= 0]
assert not bad, bad
levels = {int(row["concurrency"]): row for row in csv.DictReader(open(sys.argv[2]))}
assert sorted(levels) == [1, 4], levels
assert all(float(l["output_tokens_per_s"]) > 0 for l in levels.values()), levels
print("bench-serve: 16 requests of 8 tokens each at concurrency 1 and 4; report written")
PY

kill -TERM "$server"
status=0
wait "$server" || status=$?
trap - EXIT
cat "$work/server.log"
if [ "$status" != 0 ]; then
    echo "engine serve exited with status $status after SIGTERM" >&2
    exit 1
fi
echo "serve: the server stopped cleanly on SIGTERM"
