"""A bounded load test of `sinter serve`: N concurrent streaming clients over a fixed list of
requests, and the server's figures (throughput, time to first token, inter-token latency).

Runs wherever Python is (standard library only: threads, urllib, server-sent events):

    python3 bench/serve_load.py --url http://127.0.0.1:8000 --clients 64 --requests 256 \
        --min-prompt 16 --max-prompt 512 --max-tokens 128 --vocab 49152

Prompts are words `t<id>` of the random-weight folders of bench/hf_models.py (a word-level
tokenizer: one word, one token), so a prompt of n words is n tokens; lengths are drawn
uniformly in [min, max] with a fixed seed. Every request is `/v1/completions`, greedy,
`stream: true` with `stream_options.include_usage`, so the closing usage chunk gives the
tokens generated. Time to first token: from sending the request to its first text chunk;
inter-token latency: the gaps between a request's later chunks (a chunk per token). Prints
one JSON line; a request that fails or ends without its usage is counted in `errors`.
"""

import argparse
import json
import random
import statistics
import threading
import time
import urllib.request


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def one(url, model, prompt, max_tokens, timeout):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    times, usage = [], None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            if any(c.get("text") for c in ev.get("choices", [])):
                times.append(time.perf_counter())
    if usage is None:
        raise RuntimeError("no usage chunk")
    return t0, times, usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="the served model id (default: the first of /v1/models)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--min-prompt", type=int, default=16)
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    model = a.model or json.load(urllib.request.urlopen(a.url + "/v1/models"))["data"][0]["id"]
    rng = random.Random(a.seed)
    lengths = [rng.randint(a.min_prompt, a.max_prompt) for _ in range(a.requests)]
    prompts = [" ".join(f"t{rng.randrange(3, a.vocab)}" for _ in range(n)) for n in lengths]
    lock, nxt = threading.Lock(), [0]
    ttft, itl, gen, prompt_toks, errors = [], [], [], [], []

    def client():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= a.requests:
                return
            try:
                t0, times, usage = one(a.url, model, prompts[i], a.max_tokens, a.timeout)
                with lock:
                    if times:
                        ttft.append(times[0] - t0)
                        itl.extend(b - x for x, b in zip(times, times[1:]))
                    gen.append(usage["completion_tokens"])
                    prompt_toks.append(usage["prompt_tokens"])
            except Exception as e:  # counted, and the first few shown
                with lock:
                    errors.append(f"request {i}: {e}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ms = lambda x: None if x is None else round(1000 * x, 2)
    print(json.dumps({
        "clients": a.clients, "requests": a.requests, "completed": len(gen), "errors": len(errors),
        "first_errors": errors[:3], "prompt_tokens": sum(prompt_toks), "generated_tokens": sum(gen),
        "wall_s": round(wall, 3), "tokens_per_s": round(sum(gen) / wall, 1),
        "ttft_ms_median": ms(pct(ttft, 0.5)), "ttft_ms_p99": ms(pct(ttft, 0.99)),
        "itl_ms_median": ms(pct(itl, 0.5)), "itl_ms_p99": ms(pct(itl, 0.99)),
        "itl_ms_mean": ms(statistics.fmean(itl)) if itl else None,
    }), flush=True)


if __name__ == "__main__":
    main()
