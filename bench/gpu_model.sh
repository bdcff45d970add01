#!/usr/bin/env bash
# The GPU machine's side of the SmolLM2 run. Earlier calls copied .carry/gpu to /tmp/g and the
# model's first two parts to /tmp/p1, /tmp/p2; this call carries the third part (.carry/m3)
# and the gguf wheel (.whl) for the PyTorch anchor. Runs: the SmolLM2 GPU test against the
# transformers fixture, `sinter run --device gpu` (greedy answer; decode tokens/s at batch 1
# and 16 after a short prompt, 256 steps) with both lowerings, and the PyTorch anchor
# (bench/smollm2_graph_anchor.py) in the same call.
set -u
G=/tmp/g
export SINTER_CACHE="$G/cache" SINTER_GPU_REQUIRED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/m "$SINTER_CACHE/models"
cat /tmp/p1 /tmp/p2 .carry/m3/p3 > /tmp/m/model.gguf
sha256sum /tmp/m/model.gguf
ln -sf /tmp/m/model.gguf "$SINTER_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
echo b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 > "$SINTER_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf.sha256"
echo "== SmolLM2 GPU test (fixture, greedy answer)"
"$G/main-test" gpu_smollm2 --nocapture 2>&1 | tee "$OUT/smollm2-gpu-test.log" | grep -E "GPU|test result|panicked|skipped|max"
for low in ${LOWERINGS:-unfused}; do
    echo "== sinter run --device gpu --lowering $low"
    "$G/sinter" run --device gpu --lowering $low --max-tokens 32 2>&1 | tee "$OUT/run-$low.log" | tail -6
    echo "== decode throughput, batch 1 ($low)"
    "$G/sinter" run --device gpu --lowering $low --prompt "Tell me a long story about a dragon." --max-tokens 256 --ignore-eos 2>&1 | tail -1
    echo "== decode throughput, batch 16 ($low)"
    "$G/sinter" run --device gpu --lowering $low --batch-file bench/prompts16.txt --max-tokens 256 --ignore-eos 2>&1 | tail -1
done
echo "== PyTorch anchor, same call"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
MODEL_DIR=/tmp/m timeout 300 python3 bench/smollm2_graph_anchor.py 2>&1 | tail -15
