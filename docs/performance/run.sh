#!/usr/bin/env bash
# Regenerates the measurements of docs/performance.md: every table there is one of these outputs.
# Run it on an otherwise idle machine; each command measures its candidates side by side.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=docs/performance
export COLUMNS=120
bench() { local name=$1; shift; relpos-lab bench "$@" --json "$out/$name.json" | tee "$out/$name.txt"; }
# Issue targets: Shaw attention (a^K and a^V) forward+backward vs bare SDPA, B=8 H=8 D=64 k=16, 2 threads.
bench attention attention --threads 2 --length 512 1024 --impl gather banded batched --repeats 7
# Peak memory at L=2048 against the unfused softmax(QK^T)V, each candidate in a fresh process.
bench attention_padding attention --threads 2 --length 512 --impl gather --mask padding --repeats 7
bench attention_causal attention --threads 2 --length 512 --impl gather --mask causal --repeats 7
bench attention_memory attention --threads 2 --length 2048 --impl gather --repeats 2 --warmup 1 --memory
# One self-attention module (d_model 512, 8 heads), with and without Shaw positions, and OpenNMT-py
# 3.5.1's (max_relative_positions=16) as a peer: fetched into a scratch directory, never installed.
peer=${TMPDIR:-/tmp}/opennmt-py-3.5.1
if [ ! -f "$peer/onmt/modules/multi_headed_attn.py" ]; then
    mkdir -p "$peer" && python3 -m pip download -q OpenNMT-py==3.5.1 --no-deps -d "$peer"
    python3 -m zipfile -e "$peer"/OpenNMT_py-3.5.1-py3-none-any.whl "$peer"
fi
bench layer layer --threads 2 --length 512 1024 --repeats 7 --runs 3 --opennmt "$peer"   # the peer varies run to run: quote the range
# Training throughput of an encoder-decoder (d_model 512, 8 heads, d_ff 2048, 6+6 layers), Shaw vs sinusoidal.
bench model_64 model --threads 2 --layers 6 --batch 32 --length 64 --repeats 7
bench model_512 model --threads 2 --layers 6 --batch 4 --length 512 --repeats 5
# Cached greedy decoding vs re-running the decoder over the whole prefix, 128 tokens.
bench decode decode --threads 2 --layers 6 --batch 8 --length 64 --steps 128 --repeats 5
# The decoder-only LM (task lm's DecoderLM, same sizes, 6 layers): training throughput Shaw vs
# sinusoidal, then `relpos-lab generate`'s loop, 256 new tokens cached vs recomputed (issue 20).
bench model_decoder_only model --architecture decoder_only --threads 1 --layers 6 --batch 8 --length 512 --new-tokens 256 --repeats 5
# CPU threads on a shared machine: the main job idle and beside a 2-thread torch neighbour (the threads table).
python docs/performance/threads.py --json "$out/threads.json" | tee "$out/threads.txt"
# torch.compile (trainer.compile=default) against eager, side by side, compile time from cold caches on
# its own line: the default experiment's model (reverse_shaw: shaw_small, batch 64 at length 16) and
# a deletang2023_paper_small point (encoder-only, d_model 64, 2 layers, 16 source tokens and 16 slots).
bench model_compile_reverse_shaw model --threads 2 --d-model 64 --heads 4 --d-ff 256 --layers 2 --batch 64 --length 16 --repeats 9 --compile
bench model_compile_deletang_small model --architecture encoder_only --threads 2 --d-model 64 --heads 4 --d-ff 256 --layers 2 --batch 64 --length 16 --repeats 9 --compile
