#!/usr/bin/env bash
# The GPU section of docs/performance.md: `pytest -m cuda` and every CUDA benchmark, on one GPU.
#   docs/performance/gpu/run.sh [kernel | kernel_<part>] [tests] [attention] [peers] [model] [compile] [decode] [profile]
#   (default: all)
# `kernel` alone is the fused Triton kernel's step (issues 30, 37), sized for one 10-minute call, in
# parts, the most telling first, so that a call cut short keeps what it measured: where its time
# goes (profile_fused.py, one config) with the forward's and dk/dv's registers capped (as many
# blocks per SM as the control's) and then uncapped, Shaw and a learned rel_bias vs flash at
# L = 2048 and 8192 with peak memory, plain and causal, its tests compiled on the GPU, the 6+6
# model and the decoder-only LM in bf16-mixed with attention dropout against their sinusoidal
# twins (all in one config: RELPOS_LAB_TRITON_CONFIG; autotuning every shape spends minutes
# compiling), and last the same attention autotuned at L = 2048.
# Seen on an H200 (2026-11-26): profile ~70 s and capped ~60 s (before each profiled causal
# attention without dropout too), one-config attention ~45 s plain and ~45 s causal, kernel tests
# ~200 s (the CUDA tier's triton tests need more), models ~165 s; the autotuned attention did not
# finish in 170 s. On a lease of 15 minutes: `STEP_TIMEOUT=210 run.sh kernel` in one 10-minute
# call, then what it did not reach.
# Writes docs/performance/gpu/*.txt (the tables) and *.json next to this script; where $OUT is set
# (a lent GPU machine, which returns at most 8 files) all of them packed in $OUT/gpu_tables.tgz,
# after every step. STEP_TIMEOUT=<seconds> bounds each command. On a bare machine first:
# pip install --no-deps --no-build-isolation -e .   (plus omegaconf if missing; wandb is optional here)
# The lent machines (torch 2.11, triton 3.6, no registry) lack only omegaconf, which is pure Python:
# here `mkdir .gpusite && cp -r .venv/lib/python3*/site-packages/omegaconf .gpusite/` with
# `/.gpusite/` in .git/info/exclude, then run with carry [".gpusite"]:
# export PYTHONPATH=$PWD/.gpusite:$PWD; python3 -m pip install -q --no-deps --no-build-isolation -e .;
# STEP_TIMEOUT=210 bash docs/performance/gpu/run.sh kernel
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=docs/performance/gpu
[ -n "${OUT:-}" ] && out=/tmp/relpos_lab_gpu_tables
mkdir -p "$out"
pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/gpu_tables.tgz" -C "$out" . ; true; }
limit=(); [ -n "${STEP_TIMEOUT:-}" ] && limit=(timeout -k 10 "$STEP_TIMEOUT")
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(kernel tests attention peers model compile decode profile)
KERNEL=(kernel_capped kernel_profile kernel_attention kernel_causal kernel_tests kernel_model kernel_autotuned)
parts=(); for step in "${steps[@]}"; do [ "$step" = kernel ] && parts+=("${KERNEL[@]}") || parts+=("$step"); done
bench() {  # PIN_BENCH=1: in one config
  name=$1; shift; pin=(); [ -n "${PIN_BENCH:-}" ] && pin=("$PIN")
  env "${pin[@]}" "${limit[@]}" python3 -m relpos_lab bench "$@" --json "$out/$name.json" 2>&1 | tee "$out/$name.txt"; pack
}
PIN=RELPOS_LAB_TRITON_CONFIG=64,64,4,3
one_config() { env "$PIN" "${limit[@]}" "$@"; }
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
    kernel_capped)  # the forward and dk/dv capped (fused_tuning.REGISTER_CAPS: 4 and 3 blocks per SM, as the control's)
      one_config python3 docs/performance/gpu/profile_fused.py --config 64 64 4 3 capped --no-variants 2>&1 \
        | tee "$out/profile_fused_capped.txt"; pack ;;
    kernel_model)
      PIN_BENCH=1 bench kernel_model_one_config model --precision bf16-mixed --layers 6 --tokens 16384 \
        --length 512 2048 --impl triton gather --attention-dropout 0.1 --repeats 5 --warmup 2
      PIN_BENCH=1 bench kernel_model_decoder_only_one_config model --architecture decoder_only --precision bf16-mixed \
        --layers 6 --tokens 16384 --length 512 2048 --impl triton gather --attention-dropout 0.1 --repeats 5 \
        --warmup 2 ;;
    kernel_attention)
      PIN_BENCH=1 bench kernel_attention_one_config "${ATTN[@]}" --length 2048 8192 --candidates sdpa triton-bias \
        --impl triton --repeats 10 --warmup 3 ;;
    kernel_causal)
      PIN_BENCH=1 bench kernel_attention_causal_one_config "${ATTN[@]}" --length 2048 8192 --mask causal \
        --candidates triton-bias --impl triton --repeats 10 --warmup 3 ;;
    kernel_autotuned)
      bench kernel_attention "${ATTN[@]}" --length 2048 --candidates sdpa triton-bias --impl triton \
        --repeats 10 --warmup 3 ;;
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
    compile)  # issue 55: each model eager and compiled side by side (bf16-mixed, attention dropout 0.1;
      # Shaw through the fused kernel, which runs between graphs with dropout), compile time on its own line
      bench model_compile_base model --precision bf16-mixed --layers 6 --tokens 16384 --length 512 2048 \
        --schemes rope alibi --impl triton --attention-dropout 0.1 --compile --repeats 5 --warmup 2
      bench model_compile_decoder_only model --architecture decoder_only --precision bf16-mixed --layers 6 \
        --tokens 16384 --length 512 2048 --schemes rope alibi --impl triton --attention-dropout 0.1 --compile \
        --new-tokens 64 --repeats 5 --warmup 2
      # Delétang et al.'s model (encoder-only, 5 layers, d 64, batch 128 of ~40 + 40 slots), float32, CUDA graphs
      bench model_compile_deletang model --architecture encoder_only --layers 5 --d-model 64 --heads 8 --d-ff 256 \
        --batch 128 --length 40 --impl auto --compile reduce-overhead --repeats 20 --warmup 3 ;;
    decode)
      bench decode decode --layers 6 --batch 64 --length 64 --steps 64 --repeats 3 --warmup 1 ;;
    profile)
      python3 docs/performance/gpu/profile_banded.py 2>&1 | tee "$out/profile_banded.txt" ;;
  esac
done
