#!/usr/bin/env bash
# GPU tests in groups, each group one process under its own time limit, so a slow or failing
# group does not cut the others. Binaries come from .carry/gpu (see bench/gpu_session.sh) and
# are unpacked once per warm machine into /tmp/g. Usage:
#   bench/gpu_tests.sh SECONDS:FILTER[,FILTER...] ...      (e.g. 120:serve::gpu_,decoder::gpu)
# PRECOMPILE=S runs `precompile_gpu_test_kernels` (the candidate records some tests read) for
# at most S seconds in the background while the first groups run; FUZZ=S runs the GPU fuzzer
# for S seconds after the groups. Logs in $OUT.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/g
for b in main-test runtime-test runtime-lib ptxas; do
    [ -x /tmp/g/$b ] || { python3 -c "import lzma; open('/tmp/g/$b','wb').write(lzma.open('.carry/gpu/$b.xz').read())" && chmod +x /tmp/g/$b; }
done
export SINTER_PTXAS=/tmp/g/ptxas SINTER_CACHE=/tmp/kc SINTER_GPU_REQUIRED=1 SINTER_POISON=1
ln -sfn "$PWD" /work/main 2>/dev/null || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ -n "${PRECOMPILE:-}" ]; then
    (SINTER_PRECOMPILE=sm_90a timeout "$PRECOMPILE" /tmp/g/main-test gpu::precompile_gpu_test_kernels > "$OUT/precompile.log" 2>&1; echo "precompile exit $?" >> "$OUT/precompile.log") &
fi
n=0
for g in "$@"; do
    n=$((n + 1)); secs=${g%%:*}; filters=${g#*:}; t0=$(date +%s)
    [ "$filters" = WAIT ] && { wait; echo "== precompile: $(tail -1 "$OUT/precompile.log")"; continue; }
    echo "== group $n: $filters (limit $secs s)"
    timeout "$secs" /tmp/g/main-test ${filters//,/ } --skip gpu::fuzz::gpu_fuzz_compiled --skip precompile_gpu_test_kernels --test-threads 1 > "$OUT/group-$n.log" 2>&1
    echo "   exit $? in $(( $(date +%s) - t0 )) s"
    grep -E "^test .*(ok|FAILED|ignored)$|test result|panicked" "$OUT/group-$n.log" | tail -40
done
if [ -n "${RUNTIME:-}" ]; then
    echo "== runtime tests"
    (timeout 60 /tmp/g/runtime-test; timeout 60 /tmp/g/runtime-lib) > "$OUT/runtime-tests.log" 2>&1
    grep -E "test result|panicked|FAILED" "$OUT/runtime-tests.log" | tail -6
fi
if [ -n "${FUZZ:-}" ]; then
    echo "== GPU fuzzer ($FUZZ s)"
    SINTER_FUZZ_SECONDS="$FUZZ" timeout $((FUZZ + 60)) /tmp/g/main-test gpu::fuzz::gpu_fuzz_compiled --test-threads 1 --nocapture > "$OUT/fuzz.log" 2>&1
    grep -E "finding|FAIL|panicked|fuzz-gpu summary|test result" "$OUT/fuzz.log" | tail -20
fi
wait
