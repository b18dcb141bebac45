#!/usr/bin/env bash
# The GPU section of docs/performance.md: `pytest -m cuda` and every CUDA benchmark, on one GPU.
#   docs/performance/gpu/run.sh [kernel] [tests] [attention] [peers] [model] [decode] [profile]   (default: all)
# `kernel` alone is the fused Triton kernel's step (issue 30), sized for one 10-minute call: its
# tests compiled on the GPU, then the targets' benchmarks (Shaw and a learned rel_bias vs flash at
# L = 2048 and 8192 with peak memory, causal, and the 6+6 model and the decoder-only LM in bf16-mixed
# against their sinusoidal twins). The first calls autotune (block sizes, warps, stages).
# Writes docs/performance/gpu/*.txt (the tables) and *.json next to this script, or under $OUT
# when that is set (the lent GPU machines return files from there). On a bare machine first:
# pip install --no-deps --no-build-isolation -e .   (plus omegaconf if missing; wandb is optional here)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-docs/performance/gpu}"
mkdir -p "$out"
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(kernel tests attention peers model decode profile)
bench() { name=$1; shift; python3 -m relpos_lab bench "$@" --json "$out/$name.json" 2>&1 | tee "$out/$name.txt"; }
export COLUMNS=160 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
# Forward + backward of one attention op: bf16, a^K + a^V, k = 16, H = 8, D = 64, B = 32768 tokens / L.
ATTN=(attention --dtype bfloat16 --tokens 32768 --heads 8 --baseline flash --memory)
for step in "${steps[@]}"; do
  case $step in
    kernel)
      python3 -m pytest -q -p no:cacheprovider tests/test_triton_kernel.py 2>&1 | tee "$out/kernel_tests.txt" | tail -5
      python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py -k triton 2>&1 | tee -a "$out/kernel_tests.txt" | tail -5
      bench kernel_attention "${ATTN[@]}" --length 2048 8192 --candidates sdpa flex-bias triton-bias \
        --impl triton banded --repeats 10 --warmup 3
      bench kernel_attention_causal "${ATTN[@]}" --length 2048 8192 --mask causal --candidates triton-bias \
        --impl triton banded --repeats 10 --warmup 3
      bench kernel_model model --precision bf16-mixed --layers 6 --tokens 16384 --length 128 512 2048 \
        --impl triton gather --attention-dropout 0.1 --repeats 5 --warmup 2
      bench kernel_model_decoder_only model --architecture decoder_only --precision bf16-mixed --layers 6 \
        --tokens 16384 --length 512 2048 --impl triton gather --attention-dropout 0.1 --repeats 5 --warmup 2 ;;
    tests)  # the CUDA tier; -n spreads FlexAttention's compiles over the CPU cores (~6 min on 16)
      python3 -m pytest -m cuda tests/test_cuda.py -q -n 8 -p no:benchmark 2>&1 | tee "$out/cuda_tests.txt" | tail -40 ;;
    attention)
      bench attention_none "${ATTN[@]}" --length 512 2048 8192 --candidates sdpa --impl gather banded \
        --repeats 5 --warmup 2
      bench attention_causal "${ATTN[@]}" --length 2048 --mask causal --candidates sdpa --impl gather banded \
        --repeats 5 --warmup 2 ;;
    peers)  # FlexAttention peers: Shaw's key term as a score_mod (flex), a learned relative bias (flex-bias)
      bench attention_flex_peers "${ATTN[@]}" --length 512 1024 2048 4096 8192 --candidates sdpa flex-bias \
        --impl gather flex banded --repeats 10 --warmup 3 ;;
    model)  # the 6+6 base model (d 512, 8 heads, ff 2048), bf16-mixed, 16384 tokens per batch
      bench model_base model --precision bf16-mixed --layers 6 --tokens 16384 --length 128 512 2048 \
        --impl auto gather --repeats 5 --warmup 2 ;;
    decode)
      bench decode decode --layers 6 --batch 64 --length 64 --steps 64 --repeats 3 --warmup 1 ;;
    profile)
      python3 docs/performance/gpu/profile_banded.py 2>&1 | tee "$out/profile_banded.txt" ;;
  esac
done
