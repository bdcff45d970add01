#!/usr/bin/env bash
# The fp8 kv128 attention NaN (B1 H4/2 Sq300 Skv77 D128 causal): the filtered GPU test under
# each condition that tells the hypotheses apart — twice as it failed (poisoned outputs), once
# without poisoned outputs, with the CTA's shared memory filled with 0x7f (NaN in e4m3) and
# with 0x00 before the first copy, and through the driver's JIT instead of ptxas cubins. Each
# condition in a fresh kernel cache (which also keeps the conditions apart). Needs /tmp/g/main-test
# and /tmp/g/ptxas (bench/gpu_tests.sh unpacks them). Logs in $OUT.
# Arguments replace the conditions (NAME:VARS, VARS as for `env`); `ptxas-O1:…` style
# conditions point SINTER_PTXAS at a wrapper made here (PTXAS_FLAGS / PTXAS_BIN).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export SINTER_PTXAS=/tmp/g/ptxas SINTER_GPU_REQUIRED=1 SINTER_FP8_CASE="Sq300 Skv77"
# A wrapper ptxas per (binary, flags): /tmp/g/ptxas-NAME runs PTXAS_BIN with PTXAS_FLAGS first.
wrap() { printf '#!/bin/sh\nexec %s %s "$@"\n' "$2" "$3" > "/tmp/g/ptxas-$1"; chmod +x "/tmp/g/ptxas-$1"; }
wrap O1 /tmp/g/ptxas -O1; wrap O2 /tmp/g/ptxas -O2; wrap O0 /tmp/g/ptxas -O0
[ -x /tmp/g/ptxas13 ] && wrap 13 /tmp/g/ptxas13 ""
conditions=("$@")
[ ${#conditions[@]} -gt 0 ] || conditions=("poison-a:SINTER_POISON=1" "poison-b:SINTER_POISON=1" "no-poison:-u SINTER_POISON" \
           "fill-7f:SINTER_POISON=1 SINTER_DEBUG_SMEM_FILL=0x7f" "fill-00:SINTER_POISON=1 SINTER_DEBUG_SMEM_FILL=0x00" \
           "jit:SINTER_POISON=1 SINTER_CUBIN=0")
for exp in "${conditions[@]}"; do
    name=${exp%%:*}; vars=${exp#*:}
    t0=$(date +%s)
    env $vars SINTER_CACHE=/tmp/kc-$name timeout 90 /tmp/g/main-test gpu::fp8::gpu_fp8_attention_matches_the_interpreter --test-threads 1 > "$OUT/fp8-$name.log" 2>&1
    echo "== $name ($vars): exit $? in $(( $(date +%s) - t0 )) s; cache files $(find /tmp/kc-$name -type f | wc -l), cubins $(find /tmp/kc-$name -type f -name '*cubin*' | wc -l)"
    grep -E "^fp8 attention .*(NaN|vs)|rows? |test result" "$OUT/fp8-$name.log" | cut -c1-220 | head -12
done
