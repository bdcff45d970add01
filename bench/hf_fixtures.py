"""Reference fixtures from Hugging Face transformers for sinter's architecture tests.

Runs on the GPU machine (torch + transformers; no network): for each architecture, a config
with the real model's hyper-parameters but 2-4 layers, weights from a formula both this script
and the Rust tests compute bit for bit (tests/fixtures/hf/FORMAT: fnv1a64 + splitmix64), and
transformers' eager forward in f32 (TF32 off) and bf16 as the expected values: greedy
continuations and teacher-forced logits (top-8 and 64 fixed columns per position).

    python3 bench/hf_fixtures.py OUT_DIR [arch ...]
"""

import json
import os
import sys
import time

import numpy as np
import torch
import transformers

SEED = 20261202
STEPS = 32
TOPK = 8
NCOLS = 64
PROMPT_LENS = [7, 13, 4]
MASK64 = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & MASK64
    return h


def formula(name: str, n: int, center: float, scale: float, seed: int = SEED) -> np.ndarray:
    """The weight formula of FORMAT.md, vectorised: f32 values of one tensor."""
    key = np.uint64(fnv1a64(name.encode()) ^ seed)
    with np.errstate(over="ignore"):
        x = np.arange(n, dtype=np.uint64) + key
        x = x + np.uint64(0x9E3779B97F4A7C15)
        z = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float32) / np.float32(16777216.0)
    t = np.float32(2.0) * u - np.float32(1.0)
    return np.float32(center) + np.float32(scale) * t


def f32(x: float) -> float:
    return float(np.float32(x))


def rule(arch: str, name: str, shape) -> tuple:
    """(center, scale) of one tensor: norms near 1 (Gemma's (1 + w) near 0), small biases and
    embeddings, matrices uniform with variance 1 / fan_in."""
    leaf = name.rsplit(".", 1)[-1]
    is_norm = "norm" in name or ".ln_" in name or name.startswith("ln_") or ".ln_f" in name
    if is_norm and leaf == "weight":
        return (0.0, 0.1) if arch == "gemma3" else (1.0, 0.1)
    if leaf == "bias":
        return (0.0, 0.02)
    if "wpe" in name:
        return (0.0, 0.02)
    if "embed_tokens" in name or "wte" in name:
        return (0.0, 0.05)
    if len(shape) == 2:
        # nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out].
        fan_in = shape[0] if arch == "gpt2" else shape[1]
        return (0.0, f32((3.0 / fan_in) ** 0.5))
    return (0.0, 0.05)


def configs():
    C = transformers
    out = {}
    out["llama"] = C.LlamaConfig(  # SmolLM2-135M
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
        rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, hidden_act="silu")
    out["qwen2"] = C.Qwen2Config(  # Qwen2-0.5B
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        use_sliding_window=False, bos_token_id=151643, eos_token_id=151643)
    out["qwen3"] = C.Qwen3Config(  # Qwen3-0.6B
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=2,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)
    out["gpt2"] = C.GPT2Config(  # GPT-2 124M
        vocab_size=50257, n_embd=768, n_layer=2, n_head=12, n_positions=1024,
        layer_norm_epsilon=1e-5, activation_function="gelu_new",
        bos_token_id=50256, eos_token_id=50256)
    g = dict(  # Gemma-3-270M, 4 layers, the window cut to 8 so prompts pass it
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        query_pre_attn_scalar=256, sliding_window=8, rope_theta=1000000.0,
        rope_local_base_freq=10000.0, rms_norm_eps=1e-6, max_position_embeddings=32768,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=1, pad_token_id=0, sliding_window_pattern=4,
        layer_types=["sliding_attention"] * 3 + ["full_attention"])
    out["gemma3"] = C.Gemma3TextConfig(**g)
    return out


MODELS = {
    "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
    "gpt2": "GPT2LMHeadModel", "gemma3": "Gemma3ForCausalLM",
}


def rows(logits: torch.Tensor, cols) -> dict:
    """Top-k ids/values and the kept columns of logits [T, V] (f32 on the host)."""
    l = logits.float().cpu()
    v, i = torch.topk(l, TOPK, dim=-1)
    return {"top_ids": i.tolist(), "top_vals": v.tolist(), "cols": l[:, cols].tolist()}


def build(arch: str, cfg, device):
    cfg._attn_implementation = "eager"
    cls = getattr(transformers, MODELS[arch])
    torch.manual_seed(0)
    model = cls(cfg).to(torch.float32)
    manifest = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = list(p.shape)
            center, scale = rule(arch, name, shape)
            w = formula(name, int(np.prod(shape)), center, scale).reshape(shape)
            p.copy_(torch.from_numpy(w))
            manifest.append({"name": name, "shape": shape, "center": center, "scale": f32(scale)})
    return model.to(device).eval(), manifest


def forward(model, ids, device) -> torch.Tensor:
    x = torch.tensor([ids], dtype=torch.long, device=device)
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits[0]


def one(arch: str, cfg, out_dir: str, device):
    t0 = time.time()
    cfg_json = json.loads(cfg.to_json_string(use_diff=False))
    model, manifest = build(arch, cfg, device)
    vocab = cfg.vocab_size
    rng = np.random.default_rng(SEED)
    prompts = [[int(t) for t in rng.integers(3, vocab, size=n)] for n in PROMPT_LENS]
    cols = sorted(int(c) for c in rng.choice(vocab, size=NCOLS, replace=False))
    greedy, margins, f32_rows, seqs = [], [], [], []
    for p in prompts:
        seq, marg = list(p), []
        for _ in range(STEPS):
            last = forward(model, seq, device)[-1].float()
            v, i = torch.topk(last, 2)
            marg.append(float(v[0] - v[1]))
            seq.append(int(i[0]))
        greedy.append(seq[len(p):])
        margins.append(marg)
        seqs.append(seq)
        r = rows(forward(model, seq, device), cols)
        r["tokens"] = seq
        f32_rows.append(r)
    model = model.to(torch.bfloat16)
    bf16_rows = []
    for seq in seqs:
        r = rows(forward(model, seq, device), cols)
        r["tokens"] = seq
        bf16_rows.append(r)
    fx = {
        "arch": arch, "transformers": transformers.__version__, "torch": torch.__version__,
        "config": cfg_json, "seed": SEED, "tensors": manifest, "prompts": prompts,
        "steps": STEPS, "cols": cols,
        "f32": {"greedy": greedy, "margins": margins, "logits": f32_rows},
        "bf16": {"logits": bf16_rows},
    }
    path = os.path.join(out_dir, f"{arch}.json")
    with open(path, "w") as f:
        json.dump(fx, f, separators=(",", ":"))
    print(f"{arch}: {len(manifest)} tensors, greedy[0] {greedy[0][:8]}..., min margin "
          f"{min(min(m) for m in margins):.2e}, {os.path.getsize(path)} bytes, {time.time() - t0:.1f} s",
          flush=True)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {device}", flush=True)
    # Pin the formula: these values are checked by the Rust tests too.
    print("formula check", formula("a", 3, 0.0, 1.0).tolist(), flush=True)
    wanted = sys.argv[2:] or list(MODELS)
    cfgs = configs()
    for arch in wanted:
        try:
            one(arch, cfgs[arch], out_dir, device)
        except Exception as e:  # one architecture failing must not lose the others
            print(f"{arch}: FAILED {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
