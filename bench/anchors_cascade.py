"""The cascade anchor, beside bench/anchors.py (a copy of the shared anchors, kept unchanged):
PyTorch's sdpa decode over sinter's `cascade` bench shape — B64 GQA 32/8, a 32768-token shared
prefix + 256-token suffix per request, K/V expanded per request — in GB/s over those KV bytes.
Writes anchors_cascade.json under $OUT (rows as anchors.py's); pass both files to
`sinter bench --anchors`."""
import json, os
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench

dev = "cuda"
torch.manual_seed(0)
rows = []
B, Hq, Hkv, L, Dh = 64, 32, 8, 32768 + 256, 128
q = torch.randn(B, Hq, 1, Dh, device=dev, dtype=torch.bfloat16)
k = torch.randn(B, Hkv, L, Dh, device=dev, dtype=torch.bfloat16); v = torch.randn_like(k)
byts = 2 * B * Hkv * L * Dh * 2
shape = f"B{B} Hq{Hq} Hkv{Hkv} L{L} D{Dh}"
for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
    try:
        with sdpa_kernel(be):
            f = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            f(); ms = do_bench(f, warmup=50, rep=300, return_mode="median")
        gbs = byts / ms / 1e6
        rows.append(dict(group="cascade", name=f"sdpa {be.name.lower()}", shape=shape, ms=round(ms, 4), metric="GB/s", value=round(gbs, 2), unit="GB/s"))
        print(f"cascade    sdpa {be.name.lower():23s} {shape:34s} {ms:9.4f} ms  {gbs:9.2f} GB/s", flush=True)
    except Exception as e:
        print("  fail", be, str(e)[:100])
out = os.environ.get("OUT", ".")
json.dump(dict(device=torch.cuda.get_device_properties(0).name, torch=torch.__version__, rows=rows), open(os.path.join(out, "anchors_cascade.json"), "w"), indent=1)
