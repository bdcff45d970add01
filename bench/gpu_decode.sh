#!/usr/bin/env bash
# SmolLM2-135M decode speed in one device call, without carrying the GGUF: its published shapes
# with seeded random weights (bench/hf_models.py make; decode speed does not depend on the
# values), `sinter run` from that folder beside bench/smollm2_graph_anchor.py (own Llama forward,
# static cache, CUDA graph; torch.compile) on the same folder. Needs /tmp/g/sinter or
# .carry/bench/sinter.xz (the release CLI with LLVM). REPS (default 3) runs of each sinter row
# (16-token prompt, 256 decode steps, EOS ignored, one untimed warm-up) at batch 1 and 16, then
# one `--profile` at each batch; NOPDL=1 adds one run of each batch without programmatic
# dependent launch. Logs in $OUT.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/g /tmp/hf
if [ ! -x /tmp/g/sinter ]; then
    python3 -c "import lzma; open('/tmp/g/sinter','wb').write(lzma.open('.carry/bench/sinter.xz').read())" && chmod +x /tmp/g/sinter
fi
export SINTER_CACHE=/tmp/kc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
d=/tmp/hf/smollm2
[ -f "$d/config.json" ] || timeout 120 python3 bench/hf_models.py make "$d" smollm2 2>&1 | grep -v -i warn | tail -2
for spec in "b1:--prompt-tokens 16 --max-tokens 257 --ignore-eos" "b16:--prompt-tokens 16 --batch 16 --max-tokens 257 --ignore-eos"; do
    label=${spec%%:*}; args=${spec#*:}
    for r in $(seq "${REPS:-3}"); do
        timeout 150 /tmp/g/sinter run --model "$d" --device gpu --dtype bf16 --warmup $args > "$OUT/smollm2-$label-$r.out" 2> "$OUT/smollm2-$label-$r.log"
        echo "sinter $label run $r (exit $?): $(grep -E '^(prompt:|kernels per layer|compile:|error)' "$OUT/smollm2-$label-$r.log" | tr '\n' ' ' | cut -c1-400)"
    done
    timeout 120 /tmp/g/sinter run --model "$d" --device gpu --dtype bf16 ${args/257/33} --profile > "$OUT/smollm2-$label-profile.out" 2> "$OUT/smollm2-$label-profile.log"
    echo "profile $label (exit $?):"; sed -n '/^total: /,$p' "$OUT/smollm2-$label-profile.out" | head -8
    grep -E "^k[0-9]+ " "$OUT/smollm2-$label-profile.out" | sed -n '1,14p'
done
# NOPDL=1: each row once more with programmatic dependent launch off (SINTER_NO_PDL=1).
if [ -n "${NOPDL:-}" ]; then
    for spec in "b1:--prompt-tokens 16 --max-tokens 257 --ignore-eos" "b16:--prompt-tokens 16 --batch 16 --max-tokens 257 --ignore-eos"; do
        label=${spec%%:*}; args=${spec#*:}
        SINTER_NO_PDL=1 timeout 150 /tmp/g/sinter run --model "$d" --device gpu --dtype bf16 --warmup $args > "$OUT/smollm2-$label-nopdl.out" 2> "$OUT/smollm2-$label-nopdl.log"
        echo "sinter $label without PDL (exit $?): $(grep -E '^(prompt:|error)' "$OUT/smollm2-$label-nopdl.log" | tr '\n' ' ' | cut -c1-300)"
    done
fi
echo "== bench/smollm2_graph_anchor.py on the same folder"
MODEL_DIR="$d" OUT="$OUT" timeout 300 python3 bench/smollm2_graph_anchor.py 2>&1 | grep -v -i warn | tail -8
