#!/usr/bin/env bash
# The GPU machine's side of the SmolLM2 run, in one device call (about 5 minutes). Earlier calls
# copied .carry/gpu to /tmp/g (the LLVM-less `sinter`, the LLVM-less test binary `main-test`,
# the kernel cache) and the model's first two parts to /tmp/p1, /tmp/p2; this call carries the
# third part (.carry/m3) and the gguf wheel (.whl) for the PyTorch anchor. Runs:
# - the SmolLM2 GPU tests: fixture + greedy answer, CUDA-graph decode == eager decode, profile;
# - `sinter run --device gpu`: the greedy answer; decode tokens/s with a 16-token prompt and 256
#   decode steps at batch 1 and 16, with the decode step replayed as a CUDA graph and with
#   SINTER_NO_CUDA_GRAPH=1 (eager launches); prefill tokens/s at 512 and 2048 prompt tokens
#   (batch 1); one `--profile` (per-kernel times of a decode step). Every measured run is
#   preceded by an untimed one (--warmup: allocations, capture);
# - the PyTorch anchor (bench/smollm2_graph_anchor.py), same shapes, same call.
# Logs go to $OUT. LOWERING=unfused measures the unfused kernels instead.
set -u
G=/tmp/g
export SINTER_CACHE="$G/cache" SINTER_GPU_REQUIRED=1 SINTER_GPU_MODEL_REQUIRED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/m "$SINTER_CACHE/models"
cat /tmp/p1 /tmp/p2 .carry/m3/p3 > /tmp/m/model.gguf
sha256sum /tmp/m/model.gguf
ln -sf /tmp/m/model.gguf "$SINTER_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
echo b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 > "$SINTER_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf.sha256"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
LOW="${LOWERING:-fused}"
echo "== SmolLM2 GPU tests (fixture and answer; CUDA graph vs eager decode; profile)"
timeout 240 "$G/main-test" gpu_smollm2 engine_gpu --test-threads 1 --nocapture 2>&1 | tee "$OUT/smollm2-gpu-tests.log" \
    | grep -E "GPU|batch|test result|panicked|skipped|max|FAILED|^test "
# sinter run with the given label and arguments: standard output (text, --profile table) in
# $OUT/run-LABEL.out, standard error in $OUT/run-LABEL.log; prints the summary lines.
run() {
    local label="$1"; shift
    local f="$OUT/run-${label// /_}"
    echo "== $label"
    timeout 90 "$G/sinter" run --device gpu --lowering "$LOW" "$@" > "$f.out" 2> "$f.log"
    echo "   (exit $?)"
    grep -E "^(prompt:|kernels per layer|compile:|warm-up|error)" "$f.log"
}
run "answer" --max-tokens 32
head -c 300 "$OUT/run-answer.out"; echo
LOW=unfused run "answer unfused" --max-tokens 32
head -c 300 "$OUT/run-answer_unfused.out"; echo
for mode in graph eager; do
    if [ "$mode" = eager ]; then export SINTER_NO_CUDA_GRAPH=1; else unset SINTER_NO_CUDA_GRAPH; fi
    run "decode batch 1 $mode" --prompt-tokens 16 --max-tokens 257 --ignore-eos --warmup
    run "decode batch 16 $mode" --prompt-tokens 16 --batch 16 --max-tokens 257 --ignore-eos --warmup
done
unset SINTER_NO_CUDA_GRAPH
# The symbolic decode graph (64-row matmul tiles) instead of the one specialised to the batch.
export SINTER_NO_SPECIALIZE=1
run "decode batch 1 symbolic" --prompt-tokens 16 --max-tokens 257 --ignore-eos --warmup
run "decode batch 16 symbolic" --prompt-tokens 16 --batch 16 --max-tokens 257 --ignore-eos --warmup
run "profile symbolic" --prompt-tokens 16 --max-tokens 33 --ignore-eos --profile
unset SINTER_NO_SPECIALIZE
run "prefill 512" --prompt-tokens 512 --max-tokens 1 --warmup
run "prefill 2048" --prompt-tokens 2048 --max-tokens 1 --warmup
run "profile" --prompt-tokens 16 --max-tokens 33 --ignore-eos --profile
sed -n '/^total: /,$p' "$OUT/run-profile.out"
echo "   the 4 kernels of layer 0 and the slowest 12 (specialised):"
grep -E "^k[0-9]+ " "$OUT/run-profile.out" | sed -n '2,12p'
grep -E "^k[0-9]+ " "$OUT/run-profile.out" | sort -k3 -g -r | head -12
echo "   symbolic:"
sed -n '/^total: /,$p' "$OUT/run-profile_symbolic.out"
grep -E "^k[0-9]+ " "$OUT/run-profile_symbolic.out" | sed -n '2,12p'
echo "   (one line per kernel: $OUT/run-profile.out)"
# Batch 16: where a decode step's time goes (kernels against the step's wall time).
run "profile batch 16" --prompt-tokens 16 --batch 16 --max-tokens 33 --ignore-eos --profile
sed -n '/^total: /,$p' "$OUT/run-profile_batch_16.out"
echo "   the slowest 12 kernels at batch 16:"
grep -E "^k[0-9]+ " "$OUT/run-profile_batch_16.out" | sort -k3 -g -r | head -12
echo "== PyTorch anchor, same call"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
MODEL_DIR=/tmp/m timeout 300 python3 bench/smollm2_graph_anchor.py 2>&1 | tail -15
