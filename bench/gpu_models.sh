#!/usr/bin/env bash
# Decode and prefill speed of the registered architectures at their published sizes, random
# weights (bench/hf_models.py make), sinter beside transformers (static cache + torch.compile)
# on the same folder in the same device call. Needs /tmp/g/sinter (the release CLI with LLVM,
# unpacked by bench/gpu_session.sh earlier in the same warm session, or from .carry/gpu).
# ARCHS picks the architectures (default: qwen2 qwen3 gpt2 gemma3); SINTER=0 runs only the
# transformers anchor; REPS runs each sinter row that many times (medians). Logs in $OUT.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/g /tmp/hf
if [ ! -x /tmp/g/sinter ]; then
    python3 -c "import lzma; open('/tmp/g/sinter','wb').write(lzma.open('.carry/gpu/sinter.xz').read())" && chmod +x /tmp/g/sinter
fi
export SINTER_CACHE=/tmp/kc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for arch in ${ARCHS:-qwen2 qwen3 gpt2 gemma3}; do
    d=/tmp/hf/$arch
    echo "== $arch"
    [ -f "$d/config.json" ] || timeout 120 python3 bench/hf_models.py make "$d" "$arch" 2>&1 | grep -v -i warn | tail -2
    [ "${SINTER:-1}" = 1 ] && for spec in "b1:--prompt-tokens 16 --max-tokens 257 --ignore-eos" "b16:--prompt-tokens 16 --batch 16 --max-tokens 257 --ignore-eos" "p512:--prompt-tokens 512 --max-tokens 1"; do
        label=${spec%%:*}; args=${spec#*:}
        for r in $(seq "${REPS:-1}"); do
            timeout 150 /tmp/g/sinter run --model "$d" --device gpu --dtype bf16 --warmup $args > "$OUT/$arch-$label-$r.out" 2> "$OUT/$arch-$label-$r.log"
            echo "   sinter $label run $r (exit $?): $(grep -E '^(prompt:|kernels per layer|compile:|error)' "$OUT/$arch-$label-$r.log" | tr '\n' ' ' | cut -c1-400)"
        done
    done
    timeout 300 python3 bench/hf_models.py anchor "$d" "$arch" 2>&1 | grep -E '^\{|Error|error' | tail -3
done
