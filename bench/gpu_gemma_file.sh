#!/usr/bin/env bash
# Gemma 3 270M's real GGUF file (253 MB) on the GPU machine, which has no network: the file
# travels in 32 MiB parts, one per device call (a call carries 64 MiB with the working tree),
# calls chained while the machine stays warm. On the development machine first:
#   sinter run --model gemma3-270m --max-tokens 1        # fetches it into the cache
#   mkdir -p .carry/gemma && split -b 32M -d ~/.cache/sinter/models/gemma-3-270m-q4_k_m.gguf .carry/gemma/part-
# then, one call each: `bench/gpu_gemma_file.sh take 00` (carry .carry/gemma/part-00), … 07;
# then `bench/gpu_gemma_file.sh run` (carry .carry/gpu/sinter.xz, main-test.xz, ptxas.xz):
# the sha256 checked, the issue's command (`sinter run --model … --raw --prompt "The capital
# of France is"`, whose first eight tokens must be llama.cpp's " the capital of the country of
# France."), `gpu_gemma3_270m_gguf_matches_llama_cpp` (the committed llama.cpp fixture), and
# decode at batch 1 and 16 and prefill at 512 and 2048 tokens, each three times.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/gm /tmp/g /tmp/kc/models
case "${1:-}" in
take) cp ".carry/gemma/part-$2" /tmp/gm/ && ls -la /tmp/gm | tail -n +2 ;;
run)
    for b in sinter main-test ptxas; do
        [ -x /tmp/g/$b ] || { python3 -c "import lzma; open('/tmp/g/$b','wb').write(lzma.open('.carry/gpu/$b.xz').read())" && chmod +x /tmp/g/$b; }
    done
    f=/tmp/kc/models/gemma-3-270m-q4_k_m.gguf
    cat /tmp/gm/part-* > "$f"
    sum=$(sha256sum "$f" | cut -d' ' -f1); echo "sha256 $sum"
    [ "$sum" = a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 ] || { echo "the parts do not make the file"; exit 1; }
    echo "$sum" > "$f.sha256"
    export SINTER_PTXAS=/tmp/g/ptxas SINTER_CACHE=/tmp/kc SINTER_GPU_REQUIRED=1
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    echo "== the issue's command"
    timeout 120 /tmp/g/sinter run --model "$f" --device gpu --raw --prompt "The capital of France is" --max-tokens 8 2>&1 | tail -4
    echo "== against llama.cpp's fixture"
    timeout 150 /tmp/g/main-test gpu::gemma3::gpu_gemma3_270m_gguf_matches_llama_cpp --test-threads 1 2>&1 | grep -E "greedy|worst|test result|panicked" | tail -8
    echo "== speed"
    for spec in "b1:--prompt-tokens 16 --max-tokens 257 --ignore-eos" "b16:--prompt-tokens 16 --batch 16 --max-tokens 257 --ignore-eos" "p512:--prompt-tokens 512 --max-tokens 1" "p2048:--prompt-tokens 2048 --max-tokens 1"; do
        for r in 1 2 3; do
            timeout 120 /tmp/g/sinter run --model "$f" --device gpu --dtype bf16 --warmup ${spec#*:} > /dev/null 2> "$OUT/gemma-${spec%%:*}-$r.log"
            echo "   ${spec%%:*} run $r (exit $?): $(grep -E '^prompt:' "$OUT/gemma-${spec%%:*}-$r.log" | cut -c1-220)"
        done
    done ;;
*) echo "usage: bench/gpu_gemma_file.sh take NN | run"; exit 2 ;;
esac
