#!/usr/bin/env bash
# The GPU machine's side of a test-and-benchmark run (it has no Rust and no LLVM).
#
# Prepared on the development machine, in .carry/gpu (ignored by git, carried by the device
# tool): `runtime-test` (sinter-runtime's test binary), `main-test` (the root test binary
# built WITHOUT the llvm feature), `sinter` (the CLI without LLVM), and `cache/` (the kernel
# cache, filled by `SINTER_PRECOMPILE=sm_90a SINTER_CACHE=.carry/gpu/cache cargo test --test
# main precompile_gpu` and `sinter bench --precompile sm_90a`). Usage: bench/gpu_run.sh [tests|bench|all]
set -u
C=.carry/gpu
what="${1:-all}"
export SINTER_CACHE="$PWD/$C/cache" SINTER_GPU_REQUIRED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "$what" = tests ] || [ "$what" = all ]; then
    echo "== sinter-runtime tests"
    "$C/runtime-test" 2>&1 | tee "$OUT/runtime-tests.log" | grep -E "^test |test result|skipped|panicked" | tail -25
    echo "== GPU tests (kernel families, zoo models) against the interpreter"
    "$C/main-test" gpu:: --test-threads 1 2>&1 | tee "$OUT/gpu-tests.log" | grep -vE "^ok: " | tail -60
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    echo "== anchors (PyTorch) and sinter bench, same call"
    python3 bench/anchors.py --only ceiling swiglu rmsnorm softmax attn decode fp8 2>&1 | tee "$OUT/anchors.log" | tail -45
    python3 bench/anchors_cascade.py 2>&1 | tee -a "$OUT/anchors.log" | tail -3
    "$C/sinter" bench --anchors "$OUT/anchors.json" "$OUT/anchors_cascade.json" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
fi
