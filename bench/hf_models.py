"""Full-size models with random weights, and transformers' decode and prefill speed on them.

Runs on the GPU machine (torch + transformers + tokenizers; no network):

    python3 bench/hf_models.py make DIR ARCH     # config.json, model.safetensors (bf16), tokenizer.json
    python3 bench/hf_models.py anchor DIR ARCH   # transformers on the same folder, same call as sinter

ARCH: qwen2 (Qwen2-0.5B), qwen3 (Qwen3-0.6B), gpt2 (GPT-2 124M), gemma3 (Gemma-3-270M), each
with its published hyper-parameters. The anchor is transformers' `generate` with a static
cache and `torch.compile` (mode "reduce-overhead": CUDA graphs), greedy, bf16: decode tok/s
at batch 1 and 16 (16-token prompt, 256 new tokens, EOS ignored), and an eager forward of a
512-token prompt (prefill tok/s); one untimed run before each timed one. Prints one JSON line.
"""

import json
import os
import sys
import time

import torch
import transformers

CONFIGS = {
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


def anchor(d, arch):
    torch.backends.cuda.matmul.allow_tf32 = True
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).cuda().eval()
    # A static cache makes `generate` compile its decode step itself (transformers' default
    # compile config: fullgraph, "reduce-overhead", i.e. CUDA graphs); compiling `forward`
    # by hand as well fails in 5.17 (outputs of an overwritten CUDA graph).
    m.generation_config.cache_implementation = "static"
    vocab = m.config.vocab_size
    out = {"arch": arch, "transformers": transformers.__version__, "torch": torch.__version__}
    g = torch.Generator(device="cuda").manual_seed(0)
    for b in (1, 16):
        ids = torch.randint(3, vocab, (b, 16), device="cuda", generator=g)
        kw = dict(max_new_tokens=256, min_new_tokens=256, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            m.generate(ids, **kw)  # compile + capture
            torch.cuda.synchronize()
            t = time.perf_counter()
            m.generate(ids, **kw)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
        out[f"decode_b{b}_tok_s"] = round(b * 256 / dt, 1)
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
