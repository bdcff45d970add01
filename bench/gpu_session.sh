#!/usr/bin/env bash
# One device call of the compile-time run and the GPU tests (the GPU machine has no Rust).
# Earlier calls left the model's two parts in /tmp/p1 and /tmp/p2; this call carries
# .carry/gpu: main-test.xz (the root test binary WITH LLVM: GPU tests compile their kernels
# there), runtime-test.xz, runtime-lib.xz, sinter.xz (the release CLI with LLVM) and
# ptxas.xz (the toolchain's, from `scripts/setup`: the cubin cache's assembler).
# Runs, each under a timeout: bench/compile_time.sh 3 alone on the machine and ptxas's time
# per kernel of the last cold cache (the floor of a cold start); then, side by side, the GPU
# fuzzer for $FUZZ seconds and the precompile + GPU and engine tests; sinter-runtime's tests.
# MODEL=0: no SmolLM2 (no /tmp/p1, /tmp/p2; the compile-time run is skipped and the tests
# that need the model skip); FILTERS: the test filters (default `gpu:: engine_gpu::`).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/g /tmp/m
for b in main-test runtime-test runtime-lib sinter ptxas; do
    python3 -c "import lzma,sys; open('/tmp/g/$b','wb').write(lzma.open('.carry/gpu/$b.xz').read())" && chmod +x /tmp/g/$b
done
[ "${MODEL:-1}" = 1 ] && { cat /tmp/p1 /tmp/p2 > /tmp/m/model.gguf; sha256sum /tmp/m/model.gguf | cut -c1-16; }
export SINTER_PTXAS=/tmp/g/ptxas
ln -sfn "$PWD" /work/main 2>/dev/null || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${MODEL:-1}" = 1 ]; then
echo "== compile time"
SINTER=/tmp/g/sinter MODEL=/tmp/m/model.gguf timeout 150 bash bench/compile_time.sh 3 2>&1 | tee "$OUT/compile-time.log"
echo "== ptxas per kernel (the last cold run's PTX, one at a time)"
n=0; for f in "$OUT"/compile-time-cache-3/kernels/*.plan; do
    awk 'p{print} /^ptx [0-9]+$/{p=1}' "$f" > /tmp/k.ptx; a=$(grep -m1 '^.target' /tmp/k.ptx | awk '{print $2}' | tr -d ',')
    s=$(date +%s%N); /tmp/g/ptxas -arch="$a" -o /tmp/k.cubin /tmp/k.ptx; e=$(date +%s%N)
    echo "$(( (e - s) / 1000000 )) $(grep -m1 '^entry' "$f" | cut -c7-)"; n=$((n + 1))
done | sort -rn > "$OUT/ptxas-times.txt"
echo "   kernels $(wc -l < "$OUT/ptxas-times.txt"), sum $(awk '{s+=$1} END {print s}' "$OUT/ptxas-times.txt") ms; largest:"; head -3 "$OUT/ptxas-times.txt"
fi
export SINTER_CACHE=/tmp/kc SINTER_GPU_REQUIRED=1 SINTER_POISON=1
mkdir -p "$SINTER_CACHE/models"; [ "${MODEL:-1}" = 1 ] && ln -sf /tmp/m/model.gguf "$SINTER_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ "${MODEL:-1}" = 1 ] && echo b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 > "$SINTER_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf.sha256"
echo "== GPU fuzzer (${FUZZ:-120} s, beside the tests)"
SINTER_FUZZ_SECONDS="${FUZZ:-120}" timeout $(( ${FUZZ:-120} + 60 )) /tmp/g/main-test gpu::fuzz:: --test-threads 1 > "$OUT/fuzz.log" 2>&1 &
fuzz=$!
echo "== precompile"; t0=$(date +%s)
SINTER_PRECOMPILE=sm_90a timeout 150 /tmp/g/main-test gpu::precompile_gpu_test_kernels 2>&1 | tail -3
echo "   $(( $(date +%s) - t0 )) s"
echo "== GPU + engine tests"; t0=$(date +%s)
timeout "${TESTS:-300}" /tmp/g/main-test ${FILTERS:-gpu:: engine_gpu::} --skip gpu::fuzz:: --test-threads 1 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "^test |test result|panicked|failures?:|FAILED" | tail -70
echo "   $(( $(date +%s) - t0 )) s"
echo "== runtime tests"
(timeout 60 /tmp/g/runtime-test; timeout 60 /tmp/g/runtime-lib) 2>&1 | tee "$OUT/runtime-tests.log" | grep -E "test result|panicked|FAILED" | tail -8
wait $fuzz; echo "== fuzz (exit $?)"
grep -E "finding|FAIL|panicked|fuzz-gpu summary|test result" "$OUT/fuzz.log" | tail -20
