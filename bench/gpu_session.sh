#!/usr/bin/env bash
# One device call of the GPU test and compile-time run (the GPU machine has no Rust). Earlier
# calls left the model's two parts in /tmp/p1 and /tmp/p2; this call carries .carry/gpu:
# main-test.xz (the root test binary WITH LLVM: GPU tests compile their kernels there),
# runtime-test.xz, sinter.xz (the release CLI with LLVM, for bench/compile_time.sh).
# Runs, each under a timeout: the precompile of the GPU tests' kernels, the GPU and engine
# tests (the fuzzer for $FUZZ seconds), sinter-runtime's tests, then bench/compile_time.sh 3.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/g /tmp/m
for b in main-test runtime-test runtime-lib sinter; do
    python3 -c "import lzma,sys; open('/tmp/g/$b','wb').write(lzma.open('.carry/gpu/$b.xz').read())" && chmod +x /tmp/g/$b
done
cat /tmp/p1 /tmp/p2 > /tmp/m/model.gguf; sha256sum /tmp/m/model.gguf | cut -c1-16
export SINTER_CACHE=/tmp/kc SINTER_GPU_REQUIRED=1 SINTER_POISON=1
mkdir -p "$SINTER_CACHE/models"; ln -sf /tmp/m/model.gguf "$SINTER_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
echo b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 > "$SINTER_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf.sha256"
ln -sfn "$PWD" /work/main 2>/dev/null || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== precompile"; t0=$(date +%s)
SINTER_PRECOMPILE=sm_90a timeout 150 /tmp/g/main-test gpu::precompile_gpu_test_kernels 2>&1 | tail -3
echo "   $(( $(date +%s) - t0 )) s"
echo "== GPU + engine tests"; t0=$(date +%s)
SINTER_FUZZ_SECONDS="${FUZZ:-120}" timeout 330 /tmp/g/main-test gpu:: engine_gpu:: --test-threads 1 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "^test |test result|panicked|fuzz-gpu summary|failures?:|FAILED" | tail -70
echo "   $(( $(date +%s) - t0 )) s"
echo "== runtime tests"
(timeout 60 /tmp/g/runtime-test; timeout 60 /tmp/g/runtime-lib) 2>&1 | tee "$OUT/runtime-tests.log" | grep -E "test result|panicked|FAILED" | tail -8
echo "== compile time"
SINTER=/tmp/g/sinter MODEL=/tmp/m/model.gguf timeout 120 bash bench/compile_time.sh 3 2>&1 | tee "$OUT/compile-time.log"
