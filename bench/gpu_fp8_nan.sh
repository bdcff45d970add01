#!/usr/bin/env bash
# The fp8 kv128 attention NaN (B1 H4/2 Sq300 Skv77 D128 causal): the filtered GPU test under
# each condition that tells the hypotheses apart — twice as it failed (poisoned outputs), once
# without poisoned outputs, with the CTA's shared memory filled with 0x7f (NaN in e4m3) and
# with 0x00 before the first copy, and through the driver's JIT instead of ptxas cubins. Each
# condition in a fresh kernel cache (which also keeps the conditions apart). Needs /tmp/g/main-test
# and /tmp/g/ptxas (bench/gpu_tests.sh unpacks them). Logs in $OUT.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export SINTER_PTXAS=/tmp/g/ptxas SINTER_GPU_REQUIRED=1 SINTER_FP8_CASE="Sq300 Skv77"
for exp in "poison-a:SINTER_POISON=1" "poison-b:SINTER_POISON=1" "no-poison:-u SINTER_POISON" \
           "fill-7f:SINTER_POISON=1 SINTER_DEBUG_SMEM_FILL=0x7f" "fill-00:SINTER_POISON=1 SINTER_DEBUG_SMEM_FILL=0x00" \
           "jit:SINTER_POISON=1 SINTER_CUBIN=0"; do
    name=${exp%%:*}; vars=${exp#*:}
    t0=$(date +%s)
    env $vars SINTER_CACHE=/tmp/kc-$name timeout 90 /tmp/g/main-test gpu::fp8::gpu_fp8_attention_matches_the_interpreter --test-threads 1 > "$OUT/fp8-$name.log" 2>&1
    echo "== $name ($vars): exit $? in $(( $(date +%s) - t0 )) s"
    grep -E "^fp8 attention .*(NaN|vs)|rows? |test result" "$OUT/fp8-$name.log" | cut -c1-220 | head -12
done
