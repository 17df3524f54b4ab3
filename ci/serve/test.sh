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
