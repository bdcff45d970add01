"""The OpenAI Python client against `sinter serve` (run by tests/serve.rs).

Usage: serve_client.py BASE_URL MODEL EXPECTED_JSON

EXPECTED_JSON holds what the model answers each prompt alone (greedy), computed by the test
on the interpreter. Every check raises on failure; the last line printed is
"all checks passed".
"""

import asyncio
import json
import sys
import time

import urllib.error
import urllib.request

import openai

BASE, MODEL, EXPECTED = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
client = openai.OpenAI(base_url=BASE, api_key="none", max_retries=0, timeout=60)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def models():
    ids = [m.id for m in client.models.list().data]
    check(ids == [MODEL], f"models: {ids}")


def completions():
    want = EXPECTED["completion"]
    r = client.completions.create(model=MODEL, prompt=want["prompt"], max_tokens=want["max_tokens"], temperature=0)
    c = r.choices[0]
    check(c.text == want["text"], f"completion text {c.text!r} != {want['text']!r}")
    check(c.finish_reason == want["finish_reason"], f"finish_reason {c.finish_reason}")
    check(r.usage.prompt_tokens == want["prompt_tokens"], f"usage {r.usage}")
    check(r.usage.completion_tokens == want["completion_tokens"], f"usage {r.usage}")
    check(r.usage.total_tokens == want["prompt_tokens"] + want["completion_tokens"], f"usage {r.usage}")
    # Streamed: the same text, the finish reason on the last choice, the usage chunk.
    parts, finish, usage = [], None, None
    for chunk in client.completions.create(model=MODEL, prompt=want["prompt"], max_tokens=want["max_tokens"], temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            parts.append(ch.text)
            finish = ch.finish_reason or finish
    check("".join(parts) == want["text"], f"streamed {''.join(parts)!r} != {want['text']!r}")
    check(finish == want["finish_reason"], f"streamed finish {finish}")
    check(usage is not None and usage.completion_tokens == want["completion_tokens"], f"streamed usage {usage}")


def chat():
    want = EXPECTED["chat"]
    msgs = [{"role": "user", "content": "t9 t4 t33"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=want["max_tokens"], temperature=0)
    m = r.choices[0].message
    check(m.role == "assistant" and m.content == want["text"], f"chat {m}")
    check(r.usage.prompt_tokens == want["prompt_tokens"], f"chat usage {r.usage}")
    parts, roles, finish = [], [], None
    for chunk in client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=want["max_tokens"], temperature=0, stream=True):
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            parts.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    check(roles == ["assistant"], f"roles {roles}")
    check("".join(parts) == want["text"], f"streamed chat {''.join(parts)!r}")
    check(finish == want["finish_reason"], f"streamed chat finish {finish}")


def stops():
    want = EXPECTED["completion"]
    words = want["text"].split(" ")
    check(len(words) >= 3, f"the expected completion is too short for a stop test: {want['text']!r}")
    stop = " " + words[2]
    cut = want["text"][: want["text"].find(stop)]
    for stream in (False, True):
        r = client.completions.create(model=MODEL, prompt=want["prompt"], max_tokens=want["max_tokens"], temperature=0, stop=[stop, "never-seen"], stream=stream)
        if stream:
            chunks = list(r)
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][-1]
        else:
            text, finish = r.choices[0].text, r.choices[0].finish_reason
        check(text == cut, f"stop (stream={stream}): {text!r} != {cut!r}")
        check(finish == "stop", f"stop finish {finish}")


def seeds():
    p = EXPECTED["completion"]["prompt"]
    a = client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0.9, seed=42).choices[0].text
    b = client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0.9, seed=42).choices[0].text
    check(a == b, f"same seed, different text: {a!r} {b!r}")


def errors():
    def expect(exc, status, fn, param=None, code=None):
        try:
            fn()
        except exc as e:
            check(e.status_code == status, f"{exc.__name__}: status {e.status_code}")
            err = e.body if isinstance(e.body, dict) else {}
            check(err.get("type") and err.get("message"), f"error body {e.body}")
            if param is not None:
                check(err.get("param") == param, f"param {err.get('param')} != {param}")
            if code is not None:
                check(err.get("code") == code, f"code {err.get('code')} != {code}")
            return
        raise AssertionError(f"no {exc.__name__}")

    p = EXPECTED["completion"]["prompt"]
    expect(openai.NotFoundError, 404, lambda: client.completions.create(model="gpt-4", prompt=p), param="model", code="model_not_found")
    expect(openai.BadRequestError, 400, lambda: client.completions.create(model=MODEL, prompt=p, max_tokens=EXPECTED["context"] * 2), code="context_length_exceeded")
    expect(openai.BadRequestError, 400, lambda: client.completions.create(model=MODEL, prompt=p, temperature=-1), param="temperature")
    expect(openai.BadRequestError, 400, lambda: client.completions.create(model=MODEL, prompt=p, extra_body={"max_tokens": "many"}), param="max_tokens")
    expect(openai.BadRequestError, 400, lambda: client.completions.create(model=MODEL, prompt=p, n=2), param="n")
    expect(openai.BadRequestError, 400, lambda: client.completions.create(model=MODEL, prompt=p, logprobs=2), param="logprobs")
    expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "t1"}], frequency_penalty=0.5), param="frequency_penalty")
    expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(model=MODEL, messages=[]), param="messages")
    expect(openai.BadRequestError, 400, lambda: client.completions.create(model=MODEL, prompt=[100000]), param="prompt")
    req = urllib.request.Request(BASE + "/completions", data=b"{not json", headers={"content-type": "application/json"})
    try:
        urllib.request.urlopen(req)
        raise AssertionError("a body that is not JSON was accepted")
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        check(e.code == 400 and "error" in body, f"bad JSON: {e.code} {body}")


async def load():
    """64 concurrent streaming clients; every eighth disconnects after its first chunk."""
    aclient = openai.AsyncOpenAI(base_url=BASE, api_key="none", max_retries=0, timeout=60)

    async def one(i, want):
        stream = await aclient.completions.create(model=MODEL, prompt=want["prompt"], max_tokens=want["max_tokens"], temperature=0, stream=True)
        parts, finish = [], None
        async for chunk in stream:
            for ch in chunk.choices:
                parts.append(ch.text)
                finish = ch.finish_reason or finish
            if i % 8 == 7:
                await stream.close()
                return "left"
        check("".join(parts) == want["text"], f"load {i}: {''.join(parts)!r} != {want['text']!r}")
        check(finish == want["finish_reason"], f"load {i}: finish {finish}")
        return "ok"

    results = await asyncio.wait_for(asyncio.gather(*(one(i, w) for i, w in enumerate(EXPECTED["load"]))), timeout=120)
    check(results.count("ok") == 56 and results.count("left") == 8, f"load results {results}")
    await aclient.close()


def metrics_settle():
    """After the load: nothing queued or running, every KV page free."""
    deadline = time.time() + 10
    while True:
        text = urllib.request.urlopen(BASE.removesuffix("/v1") + "/metrics").read().decode()
        values = {line.split(" ")[0]: line.split(" ")[1] for line in text.splitlines() if line.startswith("sinter_") and " " in line}
        if values.get("sinter_kv_pages_in_use") == "0" and values.get("sinter_running_requests") == "0" and values.get("sinter_queue_length") == "0":
            check(float(values.get("sinter_kv_pages_total", "0")) > 0, f"metrics {values}")
            check(float(values.get("sinter_time_to_first_token_seconds_count", "0")) >= 64, f"metrics {values}")
            return
        check(time.time() < deadline, f"KV pages still held after the load: {values}")
        time.sleep(0.05)


for step in (models, completions, chat, stops, seeds, errors):
    step()
    print(step.__name__, "ok", flush=True)
asyncio.run(load())
print("load ok", flush=True)
metrics_settle()
print("all checks passed")
