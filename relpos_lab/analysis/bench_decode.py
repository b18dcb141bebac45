"""`relpos-lab bench decode`: the encoder-decoder's cached greedy decoding against recomputing the
whole prefix at every step; both must produce the same tokens.
"""
from __future__ import annotations

import statistics

import torch

from relpos_lab.analysis.bench_model import positions_config
from relpos_lab.analysis.bench_timing import Result, interleaved
from relpos_lab.core.decoding import greedy_search
from relpos_lab.core.transformer import EncoderDecoder, ModelConfig


@torch.no_grad()
def greedy_recompute(model, src, steps, bos_id=1):
    """The baseline without a cache: every step re-runs the decoder over the whole prefix."""
    memory, mask = model.encoder(src)
    tokens = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
    for _ in range(steps):
        nxt = model.decoder(tokens, memory, mask)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens[:, 1:]


def bench_decode(args, device, dtype) -> list[Result]:
    steps = args.steps
    shape = dict(batch=args.batch, src_length=args.length[0], steps=steps, d_model=args.d_model, layers=args.layers)
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=1000, tgt_vocab_size=1000, d_model=args.d_model, n_heads=args.heads,
                      d_ff=args.d_ff, n_encoder_layers=args.layers, n_decoder_layers=args.layers,
                      positions=positions_config("shaw", args.max_distance))
    model = EncoderDecoder(cfg).to(device=device, dtype=dtype).eval()
    src = torch.randint(4, 1000, (args.batch, args.length[0]), device=device)
    eos = -1  # never emitted: both decoders run exactly `steps` steps
    fns = {
        "decode-recompute": lambda: greedy_recompute(model, src, steps),
        "decode-cached": lambda: greedy_search(model, src, bos_id=1, eos_id=eos, pad_id=0, max_len_a=0.0,
                                               max_len_b=steps),
    }
    # Both must produce the same tokens, or the comparison means nothing.
    cached = fns["decode-cached"]()
    if not torch.equal(cached[:, : steps - 1], fns["decode-recompute"]()[:, : steps - 1]):
        raise RuntimeError("cached and recomputed greedy decoding disagree")
    times = interleaved(fns, args.repeats, args.warmup, device)
    base = statistics.median(times["decode-recompute"])
    # ratio here is speed-up over recompute (higher is better)
    return [Result(n, shape, statistics.median(t), t, None, base / statistics.median(t)) for n, t in times.items()]
