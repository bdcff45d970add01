#!/usr/bin/env bash
# Time to the first token of `sinter run --device gpu` (SmolLM2-135M, fused), cold and warm,
# phase by phase. Needs no network and no Rust: a prebuilt `sinter` WITH the llvm feature
# (cold runs generate code) and the model file.
#
#   SINTER=/tmp/g/sinter MODEL=/tmp/m/model.gguf bench/compile_time.sh [runs]
#
# - cold (three runs by default): each with a fresh, empty SINTER_CACHE and the driver's own
#   JIT cache off (CUDA_CACHE_DISABLE=1), so nothing compiled earlier is reused;
# - warm (as many runs): the same SINTER_CACHE again and again (the last cold run's).
# SINTER_JOBS sets the worker threads (default: every core); SINTER_PTXAS=/path/to/ptxas
# names the cubin cache's assembler (each cold run has an empty SINTER_CACHE, so the
# toolchain's $SINTER_CACHE/bin/ptxas is not there); SINTER_CUBIN=0 measures the driver's PTX
# JIT instead (run the script twice, OUT set apart). Each run generates one token
# (--max-tokens 1); printed: the run's wall time, the load and compile line, and the phase
# line `sinter run` prints (lowering, code generation, assembly, cache reads, module loading).
# Logs go to $OUT (default /tmp/out).
set -u
SINTER="${SINTER:-/tmp/g/sinter}"
MODEL="${MODEL:-${SINTER_CACHE:-$HOME/.cache/sinter}/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
RUNS="${1:-3}"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
[ -x "$SINTER" ] || { echo "no sinter binary at $SINTER (set SINTER=)"; exit 1; }
[ -f "$MODEL" ] || { echo "no model at $MODEL (set MODEL=)"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
echo "cores: $(nproc); SINTER_JOBS=${SINTER_JOBS:-(all cores)}; cubin assembler: ${SINTER_PTXAS:-ptxas on the PATH}; SINTER_CUBIN=${SINTER_CUBIN:-(on)}"
one() {
    local label="$1" log="$OUT/compile-time-$1.log"
    local t0 t1
    t0=$(date +%s.%N)
    "$SINTER" run --device gpu --model "$MODEL" --max-tokens 1 --prompt "Hi" > "$log.out" 2> "$log"
    local rc=$?
    t1=$(date +%s.%N)
    printf '== %s: exit %d, %s s wall\n' "$label" "$rc" "$(python3 -c "print(round($t1 - $t0, 2))")"
    grep -E "^(loaded|compile|  |error)" "$log" | sed 's/^/   /'
}
for i in $(seq 1 "$RUNS"); do
    export SINTER_CACHE="$OUT/compile-time-cache-$i"
    rm -rf "$SINTER_CACHE"; mkdir -p "$SINTER_CACHE"
    CUDA_CACHE_DISABLE=1 one "cold-$i"
done
for i in $(seq 1 "$RUNS"); do
    one "warm-$i"
done
