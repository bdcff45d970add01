#!/usr/bin/env bash
# `sinter serve` under load on the GPU machine, beside the engine's own fixed batch and the
# anchors' bandwidth ceiling, in one device call. Needs .carry/gpu/sinter.xz (the release CLI
# with LLVM) and ptxas.xz. The model: a random-weight folder at SmolLM2-135M's published
# sizes (bench/hf_models.py make … smollm2; bf16 weights), so every request runs its full
# max_tokens (EOS is 1 in 49 152 per token). REPS: measured load runs (default 3), each of
# REQUESTS (256) requests from CLIENTS (64) streaming clients, prompts of 16–512 tokens, 128
# new tokens; one unmeasured run first. Logs in $OUT.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/g /tmp/hf
for b in sinter ptxas; do
    [ -x /tmp/g/$b ] || { python3 -c "import lzma; open('/tmp/g/$b','wb').write(lzma.open('.carry/gpu/$b.xz').read())" && chmod +x /tmp/g/$b; }
done
export SINTER_PTXAS=/tmp/g/ptxas SINTER_CACHE=/tmp/kc
d=/tmp/hf/smollm2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -f "$d/config.json" ] || timeout 120 python3 bench/hf_models.py make "$d" smollm2 2>&1 | grep -v -i warn | tail -1
echo "== anchors: bandwidth ceiling (same call)"
timeout 90 python3 bench/anchors.py --only ceiling 2>&1 | grep -E "GBPS|copy|read" | tail -4
echo "== fixed batch: sinter run, 64 prompts of 264 tokens (the load's mean), 128 new tokens"
for r in 1 2 3; do
    timeout 150 /tmp/g/sinter run --model "$d" --device gpu --dtype bf16 --warmup --prompt-tokens 264 --batch 64 --max-tokens 128 --ignore-eos > /dev/null 2> "$OUT/fixed-$r.log"
    echo "   run $r (exit $?): $(grep -E '^(prompt:|error)' "$OUT/fixed-$r.log" | cut -c1-300)"
done
echo "== serve"
/tmp/g/sinter serve --model "$d" --device gpu --port 8000 > "$OUT/serve.out" 2> "$OUT/serve.log" &
srv=$!
for i in $(seq 120); do curl -sf http://127.0.0.1:8000/health > /dev/null && break; sleep 1; done
echo "   ready after ${i} s"
load() { timeout 300 python3 bench/serve_load.py --clients "${CLIENTS:-64}" --requests "${REQUESTS:-256}" --max-tokens 128 "$@"; }
echo "   warm-up: $(load --requests 64 --seed 99)"
for r in $(seq "${REPS:-3}"); do echo "   run $r: $(load --seed "$r")"; done
curl -s http://127.0.0.1:8000/metrics > "$OUT/metrics.txt"
grep -E "^sinter_(kv_pages|queue|requests|generated)" "$OUT/metrics.txt" | head -12
kill -INT $srv; t0=$(date +%s); wait $srv; echo "   server exit $? after SIGINT in $(( $(date +%s) - t0 )) s"
tail -3 "$OUT/serve.log"
