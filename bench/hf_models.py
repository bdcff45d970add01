"""Full-size models with random weights, and transformers' decode and prefill speed on them.

Runs on the GPU machine (torch + transformers + tokenizers; no network):

    python3 bench/hf_models.py make DIR ARCH     # config.json, model.safetensors (bf16), tokenizer.json
    python3 bench/hf_models.py anchor DIR ARCH   # transformers on the same folder, same call as sinter

ARCH: smollm2 (SmolLM2-135M), qwen2 (Qwen2-0.5B), qwen3 (Qwen3-0.6B), gpt2 (GPT-2 124M), gemma3 (Gemma-3-270M), each
with its published hyper-parameters. The anchor, greedy, bf16, decode tok/s at batch 1
and 16 (16-token prompt, 256 new tokens, EOS ignored), the faster of two spellings (both
printed): transformers' own model in a hand-written loop over a static cache with the decode
step compiled by `torch.compile` (mode "reduce-overhead": CUDA graphs), and `generate` with a
static cache (which compiles its step itself, but not always); plus an eager forward of a
512-token prompt (prefill tok/s); one untimed run before each, then the median of three timed runs. Prints one JSON line.
"""

import json
import os
import sys
import time

import torch
import transformers

CONFIGS = {
    "smollm2": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
        rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        use_sliding_window=False, bos_token_id=151643, eos_token_id=151643)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(
        vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024,
        layer_norm_epsilon=1e-5, activation_function="gelu_new",
        bos_token_id=50256, eos_token_id=50256)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        query_pre_attn_scalar=256, sliding_window=512, rope_theta=1000000.0,
        rope_local_base_freq=10000.0, rms_norm_eps=1e-6, max_position_embeddings=32768,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=1, pad_token_id=0,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3)),
}


def model_of(arch):
    cfg_cls, model_cls, kw = CONFIGS[arch]
    cfg = getattr(transformers, cfg_cls)(**kw)
    cfg._attn_implementation = "sdpa"
    return cfg, getattr(transformers, model_cls)


def make(d, arch):
    os.makedirs(d, exist_ok=True)
    cfg, cls = model_of(arch)
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = cls(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.copy_(torch.zeros_like(p) if arch == "gemma3" else torch.ones_like(p))
            else:
                p.normal_(0.0, 0.02)
    m.save_pretrained(d, safe_serialization=True)
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {f"t{i}": i for i in range(cfg.vocab_size)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(os.path.join(d, "tokenizer.json"))
    n = sum(p.numel() for p in m.parameters())
    print(json.dumps({"arch": arch, "made": d, "params": n}), flush=True)


def static_cache(m, batch, length):
    """A StaticCache for `batch` sequences of `length` positions (transformers 4.5x and 5.x)."""
    from transformers import StaticCache
    try:
        return StaticCache(config=m.config, max_batch_size=batch, max_cache_len=length, device="cuda", dtype=torch.bfloat16)
    except TypeError:
        return StaticCache(config=m.config, max_cache_len=length)


def loop_decode(m, ids, steps):
    """gpt-fast-style greedy decode on transformers' own model: prefill eager into a static
    cache, then one decode step (forward + argmax) compiled with torch.compile
    ("reduce-overhead": CUDA graphs, fullgraph) and called once per token. Returns tok/s of
    the timed steps (the first call of each shape compiles and is not timed)."""
    b, t = ids.shape
    cache = static_cache(m, b, t + steps + 8)

    def step(tok, pos):
        out = m(input_ids=tok, cache_position=pos, past_key_values=cache, use_cache=True)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)

    def run(n):
        cache.reset()
        pos = torch.arange(t, device="cuda")
        tok = m(input_ids=ids, cache_position=pos, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
        pos = torch.tensor([t], device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            torch.compiler.cudagraph_mark_step_begin()
            tok = compiled(tok, pos).clone()
            pos += 1
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    with torch.no_grad():
        run(8)  # compile and capture
        run(8)
        dt = sorted(run(steps) for _ in range(3))[1]
    return b * steps / dt


def anchor(d, arch):
    torch.backends.cuda.matmul.allow_tf32 = True
    out = {"arch": arch, "transformers": transformers.__version__, "torch": torch.__version__}
    g = torch.Generator(device="cuda").manual_seed(0)
    vocab = model_of(arch)[0].vocab_size
    prompts = {b: torch.randint(3, vocab, (b, 16), device="cuda", generator=g) for b in (1, 16)}
    # 1. The decode loop compiled by hand (the fair anchor: nothing but the model's forward).
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).cuda().eval()
    for b in (1, 16):
        try:
            out[f"loop_b{b}_tok_s"] = round(loop_decode(m, prompts[b], 256), 1)
        except Exception as e:  # recorded, not hidden: the row then has only generate's figure
            out[f"loop_b{b}_error"] = str(e)[:300]
    del m
    torch.compiler.reset()
    # 2. transformers' own `generate` with a static cache, which compiles its decode step
    # itself (transformers' default compile config: fullgraph, "reduce-overhead").
    # HF_GENERATE=0 skips it (device time: it compiles again).
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).cuda().eval()
    m.generation_config.cache_implementation = "static"
    for b in (1, 16) if os.environ.get("HF_GENERATE", "1") != "0" else ():
        kw = dict(max_new_tokens=256, min_new_tokens=256, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            m.generate(prompts[b], **kw)  # compile + capture
            times = []
            for _ in range(3):
                torch.cuda.synchronize()
                t = time.perf_counter()
                m.generate(prompts[b], **kw)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            dt = sorted(times)[1]
        out[f"generate_b{b}_tok_s"] = round(b * 256 / dt, 1)
    for b in (1, 16):
        out[f"decode_b{b}_tok_s"] = max(out.get(f"loop_b{b}_tok_s", 0), out.get(f"generate_b{b}_tok_s", 0))
    del m
    eager = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(3, vocab, (1, 512), device="cuda", generator=g)
    with torch.no_grad():
        eager(ids, use_cache=False)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(5):
            eager(ids, use_cache=False)
        torch.cuda.synchronize()
        out["prefill_512_tok_s"] = round(5 * 512 / (time.perf_counter() - t), 1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    {"make": make, "anchor": anchor}[sys.argv[1]](sys.argv[2], sys.argv[3])
