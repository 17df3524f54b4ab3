"""References for the real tokenizers and chat templates (goldens/real/tokenizers/).

Reads what ci/real/fetch.sh unpacks into target/real/vocab/ from llama.cpp's source: the Qwen2
and Llama 3 vocabularies (tensor-less GGUF files) and the real chat templates of the families
the engine runs. Writes, for review and commit:

- tokenizers/VOCAB.json: transformers' tokenizer, read from the GGUF file itself, on a corpus
  (unicode, whitespace runs, digits, code, special tokens, and for Qwen2's vocabulary every
  Qwen template rendering below): ids with and without special tokens, and the decoded text.
- templates/TEMPLATE.json: transformers' chat-template renderer (render_jinja_template, the
  function apply_chat_template calls) on a set of conversations, each with enable_thinking
  unset, true and false; a conversation the template refuses is recorded as refused.

Usage: python ci/real/tokenizer_reference.py VOCAB_DIR OUT_DIR (in target/real-venv).
"""

import hashlib
import json
import sys
from pathlib import Path

import transformers
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

# Template file -> the special tokens its tokenizer_config.json passes to the template.
TEMPLATES = {
    "Qwen-Qwen3-0.6B": (None, "<|im_end|>"),
    "Qwen3.5-4B": (None, "<|im_end|>"),
    "Qwen-Qwen2.5-7B-Instruct": (None, "<|im_end|>"),
    "google-gemma-4-31B-it": ("<bos>", "<eos>"),
    "LFM2.5-Instruct": ("<|startoftext|>", "<|im_end|>"),
    "openbmb-MiniCPM5-1B": ("<s>", "<|im_end|>"),
    "HuggingFaceTB-SmolLM3-3B": (None, "<|im_end|>"),
}

CONVERSATIONS = [
    ([{"role": "user", "content": "Hello! What is 2+2?"}], True),
    (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three primes."},
            {"role": "assistant", "content": "2, 3, 5."},
            {"role": "user", "content": "And the next one?"},
        ],
        True,
    ),
    (
        [
            {"role": "user", "content": "Why is the sky blue?"},
            {
                "role": "assistant",
                "content": "<think>\nRayleigh scattering.\n</think>\n\nBecause of Rayleigh scattering.",
            },
            {"role": "user", "content": "Thanks. Shorter?"},
        ],
        True,
    ),
    ([{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}], False),
    (
        [
            {
                "role": "user",
                "content": "  spaces\tand\ttabs\n\n\nnewlines, ünïcödé 日本語 🦙 and a literal <|im_start|>",
            }
        ],
        True,
    ),
]

CORPUS = [
    "Hello world",
    " Hello World!",
    "   leading, trailing and    inner runs   ",
    "\t\ttabs\n\n\n\nnewlines\r\nand CRLF\r\n",
    "Digits: 7 42 1234567 3.14159 -0.5e10 2026-12-06",
    "ünïcödé: Grüße, naïve café, Ελληνικά, русский, עברית, العربية",
    "CJK: 日本語のテキスト、中文文本，한국어 텍스트",
    "Emoji: 🦙🦙 👩‍💻 🇩🇪 ✓✗",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tlet v: Vec<u8> = vec![0xff; 4];\n\tprintln!(\"{v:?}\");\n}\n",
    "<html><body><p class=\"x\">&nbsp;text&amp;more</p></body></html>",
    "It's, they're, we've, I'm, you'll, he'd; IT'S LOUD",
    "\u00a0non-breaking\u00a0space and zero\u200bwidth",
]

SPECIALS = {
    "ggml-vocab-qwen2.gguf": [
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "text<|endoftext|>more",
    ],
    "ggml-vocab-llama-bpe.gguf": [
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
        "a<|end_of_text|>b",
    ],
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def render(template, messages, generation, thinking, bos, eos):
    kwargs = {"bos_token": bos or "", "eos_token": eos or ""}
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    try:
        return render_jinja_template(
            conversations=[messages],
            chat_template=template,
            add_generation_prompt=generation,
            **kwargs,
        )[0][0]
    except Exception as e:  # a template's raise_exception
        return {"refused": str(e)}


def main():
    vocab, out = Path(sys.argv[1]), Path(sys.argv[2])
    (out / "templates").mkdir(parents=True, exist_ok=True)
    (out / "tokenizers").mkdir(parents=True, exist_ok=True)
    qwen_renders = []
    for name, (bos, eos) in TEMPLATES.items():
        path = vocab / "templates" / f"{name}.jinja"
        template = path.read_text()
        cases = []
        for messages, generation in CONVERSATIONS:
            for thinking in (None, True, False):
                text = render(template, messages, generation, thinking, bos, eos)
                cases.append(
                    {
                        "messages": messages,
                        "add_generation_prompt": generation,
                        "enable_thinking": thinking,
                        "rendered": text,
                    }
                )
                if name.startswith("Qwen") and isinstance(text, str) and text not in qwen_renders:
                    qwen_renders.append(text)
        doc = {
            "template": f"models/templates/{name}.jinja",
            "template_sha256": sha256(path),
            "bos_token": bos,
            "eos_token": eos,
            "tool": f"transformers {transformers.__version__} render_jinja_template",
            "cases": cases,
        }
        (out / "templates" / f"{name}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        print(f"{name}: {len(cases)} renders")
    for file, specials in SPECIALS.items():
        tok = AutoTokenizer.from_pretrained(str(vocab), gguf_file=file)
        texts = CORPUS + specials + (qwen_renders if "qwen2" in file else [])
        cases = []
        for text in texts:
            ids = tok.encode(text, add_special_tokens=False)
            cases.append(
                {
                    "text": text,
                    "ids": ids,
                    "ids_with_specials": tok.encode(text, add_special_tokens=True),
                    "decoded": tok.decode(ids),
                }
            )
        doc = {
            "gguf": file,
            "gguf_sha256": sha256(vocab / file),
            "tool": f"transformers {transformers.__version__} ({type(tok).__name__} from the GGUF file)",
            "cases": cases,
        }
        key = file.removeprefix("ggml-vocab-").removesuffix(".gguf")
        (out / "tokenizers" / f"{key}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        print(f"{file}: {len(cases)} texts")


if __name__ == "__main__":
    main()
