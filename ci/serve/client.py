"""Drives `engine serve` with the official `openai` client (ci/serve/test.sh starts the
server): chat and text completions, streamed and whole, concurrent requests, a stream
cancelled midway, bad requests, and /metrics through Prometheus's own parser.

Usage: client.py BASE_URL ENGINE MODEL_DIR. Greedy answers are checked against `engine
generate` on the same folder; every check that fails raises, so a failure exits non-zero."""

import json
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
from prometheus_client.parser import text_string_to_metric_families

base, engine, model_dir = sys.argv[1:4]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
model = client.models.list().data[0].id
checks = 0


def check(ok, what):
    global checks
    if not ok:
        raise AssertionError(what)
    checks += 1


def generate(prompt, max_tokens, chat):
    """`engine generate`'s greedy answer (JSON)."""
    args = [engine, "generate", "--model", model_dir, "--json", "--temperature", "0",
            "--max-tokens", str(max_tokens), "--prompt", prompt]
    if chat:
        args.append("--chat")
    out = subprocess.run(args, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


# Whole and streamed chat: the same text as `engine generate --chat`.
want = generate("Tell me a story", 16, chat=True)
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Tell me a story"}],
    max_tokens=16, temperature=0)
check(r.choices[0].message.content == want["text"], f"chat: {r.choices[0].message.content!r} vs {want['text']!r}")
check(r.choices[0].finish_reason == want["finish_reason"], "chat finish_reason")
check(r.usage.completion_tokens == len(want["tokens"]), "chat usage")
pieces = []
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Tell me a story"}],
    max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True})
usage = None
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
    if chunk.usage:
        usage = chunk.usage
check("".join(pieces) == want["text"], "streamed chat text")
check(usage is not None and usage.prompt_tokens_details.cached_tokens > 0,
      "the repeated prompt came from the prefix cache")

# Text completions, 8 at once: each equals its own `engine generate` run.
prompts = [f"Item {i}: the weather" + " and more" * i for i in range(8)]
with ThreadPoolExecutor(8) as pool:
    answers = list(pool.map(lambda p: client.completions.create(
        model=model, prompt=p, max_tokens=10, temperature=0), prompts))
for p, a in zip(prompts, answers):
    w = generate(p, 10, chat=False)
    check(a.choices[0].text == w["text"], f"completion of {p!r}")

# A stream closed after its first chunks: the server cancels it and keeps serving.
stream = client.completions.create(model=model, prompt="Count", max_tokens=2000,
                                   temperature=0, stream=True)
for i, _ in enumerate(stream):
    if i == 2:
        break
stream.close()
deadline = time.time() + 30
while "engine_requests_total{outcome=\"cancelled\"} 0" in urllib.request.urlopen(base + "/metrics").read().decode():
    check(time.time() < deadline, "the closed stream was not cancelled")
    time.sleep(0.05)

# Bad requests: 4xx errors the client raises as such, with the server's message.
for kwargs, status in [
    (dict(max_tokens=0), 400),
    (dict(temperature=5.0), 400),
    (dict(n=2), 400),
    (dict(top_p=0.0), 400),
]:
    try:
        client.completions.create(model=model, prompt="hi", **kwargs)
        check(False, f"{kwargs} was accepted")
    except openai.APIStatusError as e:
        check(e.status_code == status and isinstance(e.body, dict) and e.body.get("message"),
              f"{kwargs}: {e.status_code} {e.body}")
try:
    client.chat.completions.create(model=model, messages=[], max_tokens=4)
    check(False, "an empty conversation was accepted")
except openai.BadRequestError as e:
    check("message" in str(e), str(e))

# /metrics parses as Prometheus text and counts what happened.
text = urllib.request.urlopen(base + "/metrics").read().decode()
families = {f.name: f for f in text_string_to_metric_families(text)}
def value(family, **labels):
    for s in families[family].samples:
        if all(s.labels.get(k) == v for k, v in labels.items()) and s.name.endswith(("_total", family)):
            return s.value
    raise KeyError(family)
check(value("engine_requests", outcome="ok") == 10, "ok requests counted")
check(value("engine_requests", outcome="cancelled") == 1, "the closed stream counted as cancelled")
check(value("engine_requests", outcome="client_error") >= 5, "client errors counted")
check(families["engine_time_to_first_token_seconds"].type == "histogram", "TTFT histogram")
check(value("engine_cached_prompt_tokens") > 0, "cached prompt tokens counted")
print(f"openai {openai.__version__}: {checks} checks passed against {base}")
