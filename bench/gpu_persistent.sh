#!/usr/bin/env bash
# The persistent decode kernel against the CUDA graph of the step's kernels, in one device
# call: SmolLM2-135M's published shapes with seeded random weights (bench/hf_models.py make),
# `sinter run` with and without --persistent (16-token prompt, 256 decode steps, EOS ignored,
# one untimed warm-up), REPS runs of each at batch 1 and 16; the generated text of both
# compared (greedy: the same tokens expected); then bench/smollm2_graph_anchor.py on the same
# folder. Needs /tmp/g/sinter or .carry/bench/sinter.xz (the release CLI with LLVM). Logs in $OUT.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/g /tmp/hf
if [ ! -x /tmp/g/sinter ]; then
    python3 -c "import lzma; open('/tmp/g/sinter','wb').write(lzma.open('.carry/bench/sinter.xz').read())" && chmod +x /tmp/g/sinter
fi
export SINTER_CACHE=/tmp/kc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
d=/tmp/hf/smollm2
[ -f "$d/config.json" ] || timeout 120 python3 bench/hf_models.py make "$d" smollm2 2>&1 | grep -v -i warn | tail -2
# BATCHES: the batch sizes (default 1 3 16; batch 3 runs once a mode).
for b in ${BATCHES:-1 3 16}; do
    spec="b$b:--prompt-tokens 16 --batch $b --max-tokens 257 --ignore-eos"
    label=${spec%%:*}; args=${spec#*:}
    for mode in graph persistent; do
        flag=""; [ $mode = persistent ] && flag="--persistent"
        reps=${REPS:-3}; [ $label = b3 ] && reps=1
        for r in $(seq "$reps"); do
            timeout 150 /tmp/g/sinter run --model "$d" --device gpu --dtype bf16 --warmup $flag $args > "$OUT/$label-$mode-$r.out" 2> "$OUT/$label-$mode-$r.log"
            echo "$label $mode run $r (exit $?): $(grep -E '^(prompt:|error|Error)' "$OUT/$label-$mode-$r.log" | tr '\n' ' ' | cut -c1-300)"
        done
    done
    if cmp -s "$OUT/$label-graph-1.out" "$OUT/$label-persistent-1.out"; then echo "$label: the same text ($(wc -c < "$OUT/$label-graph-1.out") bytes)"; else echo "$label: TEXT DIFFERS ($(wc -c < "$OUT/$label-graph-1.out") / $(wc -c < "$OUT/$label-persistent-1.out") bytes)"; fi
done
# MINCTAS=1: one more persistent run at each batch with registers for one CTA an SM.
if [ -n "${MINCTAS:-}" ]; then
    for spec in "b1:--prompt-tokens 16 --max-tokens 257 --ignore-eos" "b16:--prompt-tokens 16 --batch 16 --max-tokens 257 --ignore-eos"; do
        label=${spec%%:*}; args=${spec#*:}
        SINTER_PERSISTENT_MIN_CTAS=$MINCTAS timeout 150 /tmp/g/sinter run --model "$d" --device gpu --dtype bf16 --warmup --persistent $args > "$OUT/$label-minctas.out" 2> "$OUT/$label-minctas.log"
        echo "$label persistent, $MINCTAS CTA an SM (exit $?): $(grep -E '^(prompt:|error)' "$OUT/$label-minctas.log" | tr '\n' ' ' | cut -c1-300)"
    done
fi
[ "${ANCHOR:-1}" = 1 ] || exit 0
echo "== bench/smollm2_graph_anchor.py on the same folder"
MODEL_DIR="$d" OUT="$OUT" timeout 240 python3 bench/smollm2_graph_anchor.py 2>&1 | grep -v -i warn | tail -6
