#!/usr/bin/env bash
# The GPU section of docs/performance.md: `pytest -m cuda` and every CUDA benchmark, on one GPU.
#   docs/performance/gpu/run.sh [kernel | kernel_<part>] [tests] [attention] [peers] [model] [decode] [profile]   (default: all)
# `kernel` alone is the fused Triton kernel's step (issues 30, 37), sized for one 10-minute call:
# where its time goes (profile_fused.py, one config), its tests compiled on the GPU (one config:
# RELPOS_LAB_TRITON_CONFIG, or autotuning every shape spends the call compiling), then the targets'
# benchmarks, autotuned (Shaw and a learned rel_bias vs flash at L = 2048 and 8192 with peak memory,
# causal, and the 6+6 model and the decoder-only LM in bf16-mixed against their sinusoidal twins).
# Writes docs/performance/gpu/*.txt (the tables) and *.json next to this script; where $OUT is set
# (a lent GPU machine, which returns at most 8 files) all of them packed in $OUT/gpu_tables.tgz,
# after every step. STEP_TIMEOUT=<seconds> bounds each command. On a bare machine first:
# pip install --no-deps --no-build-isolation -e .   (plus omegaconf if missing; wandb is optional here)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=docs/performance/gpu
[ -n "${OUT:-}" ] && out=/tmp/relpos_lab_gpu_tables
mkdir -p "$out"
pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/gpu_tables.tgz" -C "$out" . ; true; }
limit=(); [ -n "${STEP_TIMEOUT:-}" ] && limit=(timeout -k 10 "$STEP_TIMEOUT")
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(kernel tests attention peers model decode profile)
# `kernel` is its parts, the most telling first, so that a call cut short keeps what it measured.
KERNEL=(kernel_profile kernel_tests kernel_attention kernel_capped kernel_causal kernel_model)
parts=(); for step in "${steps[@]}"; do [ "$step" = kernel ] && parts+=("${KERNEL[@]}") || parts+=("$step"); done
bench() { name=$1; shift; "${limit[@]}" python3 -m relpos_lab bench "$@" --json "$out/$name.json" 2>&1 | tee "$out/$name.txt"; pack; }
one_config() { RELPOS_LAB_TRITON_CONFIG=64,64,4,3 "${limit[@]}" "$@"; }
export COLUMNS=160 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
# Forward + backward of one attention op: bf16, a^K + a^V, k = 16, H = 8, D = 64, B = 32768 tokens / L.
ATTN=(attention --dtype bfloat16 --tokens 32768 --heads 8 --baseline flash --memory)
for step in "${parts[@]}"; do
  case $step in
    kernel_profile)
      one_config python3 docs/performance/gpu/profile_fused.py 2>&1 | tee "$out/profile_fused.txt"; pack ;;
    kernel_tests)
      one_config python3 -m pytest -q -n 8 -p no:cacheprovider -p no:benchmark tests/test_triton_kernel.py 2>&1 \
        | tee "$out/kernel_tests.txt" | tail -5
      one_config python3 -m pytest -q -n 8 -p no:cacheprovider -p no:benchmark -m cuda tests/test_cuda.py -k triton 2>&1 \
        | tee -a "$out/kernel_tests.txt" | tail -5; pack ;;
    kernel_attention)
      bench kernel_attention "${ATTN[@]}" --length 2048 8192 --candidates sdpa flex-bias triton-bias \
        --impl triton banded --repeats 10 --warmup 3 ;;
    kernel_capped)  # the forward's config with its registers capped (fused.REGISTER_CAP); dk/dv spills there
      one_config python3 docs/performance/gpu/profile_fused.py --config 64 64 4 3 168 --no-variants 2>&1 \
        | tee "$out/profile_fused_capped.txt"; pack ;;
    kernel_causal)
      bench kernel_attention_causal "${ATTN[@]}" --length 2048 8192 --mask causal --candidates triton-bias \
        --impl triton banded --repeats 10 --warmup 3 ;;
    kernel_model)
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
