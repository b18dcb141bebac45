"""Regenerate the golden files tests/golden/*.json from the peer libraries (dev only).

tests/test_golden.py reads the JSON files and checks relpos_lab's tasks and position schemes against
them without any peer installed; this script is the only place the peers are imported, and only
their outputs go into the files. Each file records the peer, its version (the DeepMind reference:
its commit), what was computed and the seeded inputs.

Install the peers outside the project's venv, reusing its torch (--no-deps: the light dependencies
are listed by hand, so pip never installs a second torch):

    /work/main/.venv/bin/pip install --no-deps --target /tmp/peers_site \\
        rotary-embedding-torch x-transformers transformers einops einx loguru frozendict \\
        torch-einops-utils huggingface_hub tokenizers safetensors httpx2 httpcore2 truststore hf-xet \\
        typer shellingham jax jaxlib chex absl-py toolz dm-tree ml_dtypes opt_einsum scipy dm-haiku jmp

(dm-haiku and jmp only for the reference's Transformer module, whose encodings positions_deepmind.json holds,
whose loss and initial parameters training_deepmind.json holds, and whose logits model_deepmind.json holds.)

The DeepMind reference of Delétang et al. (2023) is not on PyPI. Put a checkout of
google-deepmind/neural_networks_chomsky_hierarchy in a folder of that name (its modules import
themselves as `neural_networks_chomsky_hierarchy.tasks...`); from a bare copy of the repository:

    mkdir -p /tmp/nnch_root/neural_networks_chomsky_hierarchy
    git --git-dir=<bare copy>/repo archive HEAD | tar -x -C /tmp/nnch_root/neural_networks_chomsky_hierarchy
    git --git-dir=<bare copy>/repo rev-parse HEAD     # the commit, for --deepmind-commit

(a `git clone` into /tmp/nnch_root/neural_networks_chomsky_hierarchy does as well; the commit is
then read from it). Ruoss et al.'s (2023), google-deepmind/randomized_positional_encodings, goes the
same way into /tmp/rpe_root/randomized_positional_encodings (positions_rpe.json, model_rpe.json, --rpe-commit).
Then, from the repository root:

    OMP_NUM_THREADS=1 JAX_PLATFORMS=cpu PYTHONPATH=/tmp/peers_site:/tmp/nnch_root:/tmp/rpe_root \\
        .venv/bin/python dev/golden/make_golden.py --deepmind-commit <commit> --rpe-commit <commit>

`--only NAME...` regenerates some files: names without .json, or their beginnings (chomsky_even_pairs,
chomsky_ for the 15 tasks, alibi_x_transformers, ...). The script is deterministic: a rerun with the
same peers rewrites the same bytes. The files were last made with rotary-embedding-torch 0.9.1,
x-transformers 2.31.10, transformers 5.24.0, jax 0.10.2, dm-haiku 0.0.17, the reference at
2b8eb4bee872acf5b637fcc672f01c06939dc4ef (2024-04-12) and Ruoss et al.'s at
e8c64749d8cad7772dc7ade75b32ef9b2b29b466 (2023-06-21), on torch 2.13.0+cpu.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "golden"
SCRIPT = "dev/golden/make_golden.py"

# --- helpers ----------------------------------------------------------------------------------


def version(package: str) -> str:
    return importlib.metadata.version(package)


def floats(t) -> list:
    """A tensor as nested lists of floats with 9 significant digits (a float32 exactly; float64 to ~1e-9)."""
    t = (t.detach() if isinstance(t, torch.Tensor) else torch.tensor(np.array(t, dtype=np.float64))).double()
    if t.dim() == 0:
        return float(f"{t.item():.9g}")
    return [floats(x) for x in t] if t.dim() > 1 else [float(f"{x:.9g}") for x in t.tolist()]


def ints(t) -> list:
    return torch.as_tensor(np.array(t)).long().tolist()


def dump(name: str, obj: dict) -> None:
    """Write tests/golden/<name>.json: indented, but a list of numbers, or a short list of such
    lists (an example's input and output), on one line."""
    path = OUT / f"{name}.json"
    path.write_text(encode(obj) + "\n")
    print(f"{path.relative_to(ROOT)}: {path.stat().st_size / 1024:.1f} KiB")


def encode(obj, indent: str = "") -> str:
    flat = json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))
    numbers = lambda x: isinstance(x, list) and all(isinstance(v, (int, float)) for v in x)  # noqa: E731
    if not isinstance(obj, (dict, list)) or numbers(obj) or (all(map(numbers, obj)) and len(flat) <= 300):
        return flat
    inner = indent + " "
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {encode(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    return "[\n" + ",\n".join(inner + encode(v, inner) for v in obj) + "\n" + indent + "]"


def header(peer: str, peer_version: str, computed: str, **extra) -> dict:
    return {"peer": peer, "peer_version": peer_version, "generated_by": SCRIPT, "torch": torch.__version__,
            "computed": computed, **extra}


def randn(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- the 15 tasks of Delétang et al. (2023), from the DeepMind reference ------------------------

# our registry name: (reference module, class, constructor kwargs as experiments/constants.py's TASK_BUILDERS)
REFERENCE_TASKS = {
    "even_pairs": ("tasks.regular.even_pairs", "EvenPairs", {}),
    "modular_arithmetic": ("tasks.regular.modular_arithmetic", "ModularArithmetic", {}),
    "parity_check": ("tasks.regular.parity_check", "ParityCheck", {}),
    "cycle_navigation": ("tasks.regular.cycle_navigation", "CycleNavigation", {}),
    "stack_manipulation": ("tasks.dcf.stack_manipulation", "StackManipulation", {}),
    "reverse_string": ("tasks.dcf.reverse_string", "ReverseString", {}),
    "modular_arithmetic_brackets": ("tasks.dcf.modular_arithmetic_brackets", "ModularArithmeticBrackets",
                                    {"mult": True}),
    "solve_equation": ("tasks.dcf.solve_equation", "SolveEquation", {}),
    "duplicate_string": ("tasks.cs.duplicate_string", "DuplicateString", {}),
    "missing_duplicate_string": ("tasks.cs.missing_duplicate_string", "MissingDuplicateString", {}),
    "odds_first_string": ("tasks.cs.odds_first", "OddsFirst", {}),
    "binary_addition": ("tasks.cs.binary_addition", "BinaryAddition", {}),
    "binary_multiplication": ("tasks.cs.binary_multiplication", "BinaryMultiplication", {}),
    "compute_sqrt": ("tasks.cs.compute_sqrt", "ComputeSqrt", {}),
    "bucket_sort": ("tasks.cs.bucket_sort", "BucketSort", {}),
}
TASK_LENGTHS = (1, 2, 3, 5, 8, 20, 41)
PER_LENGTH = 30


def task_files(commit: str) -> dict[str, dict]:
    import importlib

    import jax
    from neural_networks_chomsky_hierarchy.tasks import task as reference_task

    files = {}
    for index, (name, (module, cls_name, kwargs)) in enumerate(REFERENCE_TASKS.items()):
        cls = getattr(importlib.import_module(f"neural_networks_chomsky_hierarchy.{module}"), cls_name)
        # The reference masks the accuracy after the first termination token (symbol 2) in the
        # tasks that override accuracy_mask: their outputs are padded with zeros behind it.
        masked = cls.accuracy_mask is not reference_task.GeneralizationTask.accuracy_mask
        by_length = []
        for length in TASK_LENGTHS:
            # A fresh instance per length: ModularArithmetic keeps its operators in a generator,
            # which the first sample_batch consumes (a second length would then find none).
            ref = cls(**kwargs)
            seed = 1000 * index + length
            random.seed(seed)  # binary addition/multiplication, compute sqrt
            np.random.seed(seed)  # stack manipulation, the bracket tasks, the binary tasks' lengths
            batch = ref.sample_batch(jax.random.PRNGKey(seed), PER_LENGTH, length)  # the jax tasks
            inputs = np.asarray(batch["input"]).argmax(-1)
            outputs = np.asarray(batch["output"]).argmax(-1)
            if outputs.ndim == 1:
                outputs = outputs[:, None]  # a class: a one-symbol output
            by_length.append({"length": length, "seed": seed,
                              "pairs": [[ints(x), ints(y)] for x, y in zip(inputs, outputs)]})
        files[f"chomsky_{name}"] = {
            **header("google-deepmind/neural_networks_chomsky_hierarchy", commit,
                     f"{cls_name}(**{kwargs}).sample_batch(jax.random.PRNGKey(seed), {PER_LENGTH}, length), a new "
                     "instance per length, after "
                     "random.seed(seed) and numpy.random.seed(seed); input and output as symbol indices (the argmax "
                     "of the one-hots), the output raw: padding and termination token as the reference writes them",
                     jax=version("jax"), numpy=np.__version__),
            "task": name,
            "reference": f"{module}.{cls_name}",
            "reference_kwargs": kwargs,
            "termination_token": 2 if masked else None,
            "accuracy_mask": ("positions up to and including the first maximum symbol (the termination token 2)"
                              if masked else "every position"),
            "output_length": {str(n): cls(**kwargs).output_length(n) for n in TASK_LENGTHS},
            "by_length": by_length,
        }
    return files


# --- position schemes -------------------------------------------------------------------------

ROPE_CASES = [  # (name, head dim, base, length, offset, seed)
    ("d16_base10000", 16, 10000.0, 10, 0, 1),
    ("d16_base10000_offset7", 16, 10000.0, 6, 7, 2),
    ("d8_base500", 8, 500.0, 16, 0, 3),
]


def rope_rotary_embedding_torch() -> dict:
    from rotary_embedding_torch import RotaryEmbedding

    cases = []
    for name, dim, base, length, offset, seed in ROPE_CASES:
        rope = RotaryEmbedding(dim, theta=base, cache_if_possible=False)
        q, k = randn(seed, 1, length, dim), randn(seed + 100, 1, length, dim)
        cases.append({"name": name, "head_dim": dim, "base": base, "length": length, "offset": offset,
                      "theta": floats(rope.freqs), "q": floats(q), "k": floats(k),
                      "rotated_q": floats(rope.rotate_queries_or_keys(q, offset=offset)),
                      "rotated_k": floats(rope.rotate_queries_or_keys(k, offset=offset))})
    scaled = []
    for kind, dim, factor, length, seed in (("linear", 16, 3.0, 10, 4), ("linear", 8, 2.5, 16, 5),
                                            ("ntk", 16, 3.0, 10, 6), ("ntk", 64, 8.0, 4, 7)):
        if kind == "linear":  # positions divided by the factor
            rope = RotaryEmbedding(dim, interpolate_factor=factor, cache_if_possible=False)
        else:  # NTK-aware: base · s^(D/(D−2))
            rope = RotaryEmbedding(dim, theta_rescale_factor=factor, cache_if_possible=False)
        q = randn(seed, 1, length, dim)
        scaled.append({"name": f"{kind}_d{dim}_s{factor:g}", "scaling": kind, "head_dim": dim, "base": 10000.0,
                       "factor": factor, "length": length, "theta": floats(rope.freqs), "q": floats(q),
                       "rotated_q": floats(rope.rotate_queries_or_keys(q))})
    return {**header("rotary-embedding-torch", version("rotary-embedding-torch"),
                     "RotaryEmbedding(dim, theta=base).rotate_queries_or_keys(x, offset) of seeded float32 q, k "
                     "(heads, length, dim), and its frequencies `freqs`; scaled: interpolate_factor=s (linear, "
                     "positions / s) or theta_rescale_factor=s (NTK-aware, base · s^(D/(D−2))) at offset 0",
                     layout="interleaved: pair t is dims (2t, 2t+1) (its rotate_half); ours is the half split, "
                            "pair t = dims (t, t + D/2): the test permutes the dims"),
            "cases": cases, "scaled": scaled}


XPOS_CASES = [  # (name, head dim, scale base γ, length, seed)
    ("d16_gamma512", 16, 512.0, 10, 11),
    ("d16_gamma8", 16, 8.0, 10, 12),
    ("d8_gamma4", 8, 4.0, 13, 13),
]


def xpos_rotary_embedding_torch() -> dict:
    from rotary_embedding_torch import RotaryEmbedding

    cases = []
    for name, dim, gamma, length, seed in XPOS_CASES:
        rope = RotaryEmbedding(dim, use_xpos=True, xpos_scale_base=gamma, cache_if_possible=False)
        q, k = randn(seed, 1, length, dim), randn(seed + 100, 1, length, dim)
        rq, rk = rope.rotate_queries_and_keys(q, k)
        cases.append({"name": name, "head_dim": dim, "scale_base": gamma, "length": length, "q": floats(q),
                      "k": floats(k), "rotated_q": floats(rq), "rotated_k": floats(rk),
                      "scores": floats(rq @ rk.transpose(-1, -2))})
    return {**header("rotary-embedding-torch", version("rotary-embedding-torch"),
                     "RotaryEmbedding(dim, use_xpos=True, xpos_scale_base=γ).rotate_queries_and_keys(q, k) of "
                     "seeded float32 q, k (heads, length, dim), and the scores rotated_q @ rotated_kᵀ",
                     layout="interleaved pairs (2t, 2t+1), as rope_rotary_embedding_torch.json",
                     centring="its decay exponent is (n − length // 2)/γ (get_scale), ours n/γ: q differs by "
                              "ζ^((length // 2)/γ), k by its inverse, the scores not at all"),
            "cases": cases}


def rope_scaling_transformers() -> dict:
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    def init(kind, head_dim, train_length, factor, seq_len=None):
        rope = {"rope_type": kind, "factor": factor, "rope_theta": 10000.0}
        config = transformers.LlamaConfig(hidden_size=head_dim, num_attention_heads=1, head_dim=head_dim,
                                          max_position_embeddings=train_length, rope_parameters=rope)
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)
        return floats(inv_freq), float(attention_factor)

    cases = []
    # (ours, head dim, training length L, our rope_scaling_factor (0: dynamic), the call's length)
    for ours, dim, train_length, factor, length in [
            ("yarn", 64, 64, 4.0, 640), ("yarn", 128, 4096, 4.0, 40960), ("yarn", 8, 8, 3.0, 80),
            ("yarn", 64, 4, 2.0, 40), ("yarn", 32, 16, 0.0, 40),
            ("linear", 64, 64, 4.0, 640), ("linear", 16, 8, 0.0, 20),
            ("ntk", 64, 64, 0.0, 160), ("ntk", 16, 8, 0.0, 20)]:
        s = factor or length / train_length
        if ours == "ntk":  # transformers' dynamic NTK: base · (f·len/L − (f − 1))^(D/(D−2)); f = 1 is ours
            peer, peer_factor, seq_len = "dynamic", 1.0, length
        else:
            peer, peer_factor, seq_len = ours, s, None
        inv_freq, attention_factor = init(peer, dim, train_length, peer_factor, seq_len)
        cases.append({"name": f"{ours}_d{dim}_L{train_length}_{'dynamic' if not factor else f's{factor:g}'}",
                      "rope_scaling": ours, "head_dim": dim, "base": 10000.0, "rope_train_length": train_length,
                      "rope_scaling_factor": factor, "length": length, "peer_rope_type": peer,
                      "peer_factor": peer_factor, "peer_seq_len": seq_len, "inv_freq": inv_freq,
                      "attention_factor": attention_factor})
    return {**header("transformers", transformers.__version__,
                     "modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type](LlamaConfig(head_dim, "
                     "max_position_embeddings=L, rope_parameters={rope_type, factor, rope_theta: 10000}), seq_len): "
                     "(inv_freq, attention_factor), float32. Ours: rope_scaling=yarn/linear at the factor s "
                     "(dynamic: s = length / L); ntk (dynamic) against `dynamic` at factor 1 and seq_len = length"),
            "cases": cases}


def alibi_x_transformers() -> dict:
    import x_transformers
    from x_transformers.x_transformers import AlibiPositionalBias

    cases = []
    for heads in (6, 8, 12, 16):
        alibi = AlibiPositionalBias(heads)
        cases.append({"heads": heads, "slopes": floats(AlibiPositionalBias._get_slopes(heads)),
                      "length": 5, "bias": floats(alibi(5, 5))})
    return {**header("x-transformers", version("x-transformers"),
                     "AlibiPositionalBias._get_slopes(heads) and AlibiPositionalBias(heads)(i=5, j=5): the bias "
                     "(heads, 5, 5) = −slope·|j − i| of 5 queries at positions 0..4 over 5 keys"),
            "module": x_transformers.__name__, "cases": cases}


T5_SETTINGS = [(32, 128), (16, 64), (64, 256), (8, 20)]  # (num_buckets, max_distance)
T5_OFFSETS = (-300, 300)


def t5_buckets_transformers() -> dict:
    import transformers
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(T5_OFFSETS[0], T5_OFFSETS[1] + 1)
    cases = [{"num_buckets": n, "max_distance": d, "bidirectional": b,
              "buckets": ints(T5Attention._relative_position_bucket(rel, bidirectional=b, num_buckets=n,
                                                                     max_distance=d))}
             for n, d in T5_SETTINGS for b in (True, False)]
    return {**header("transformers", transformers.__version__,
                     "models.t5.modeling_t5.T5Attention._relative_position_bucket(relative_position, bidirectional, "
                     "num_buckets, max_distance) for relative_position = key − query = "
                     f"{T5_OFFSETS[0]}..{T5_OFFSETS[1]}"),
            "offsets": list(T5_OFFSETS), "cases": cases}


def t5_buckets_x_transformers() -> dict:
    from x_transformers.x_transformers import RelativePositionBias

    rel = torch.arange(T5_OFFSETS[0], T5_OFFSETS[1] + 1)
    cases = [{"num_buckets": n, "max_distance": d, "bidirectional": b,
              "buckets": ints(RelativePositionBias._relative_position_bucket(rel, causal=not b, num_buckets=n,
                                                                             max_distance=d))}
             for n, d in T5_SETTINGS for b in (True, False)]
    return {**header("x-transformers", version("x-transformers"),
                     "RelativePositionBias._relative_position_bucket(relative_position, causal=not bidirectional, "
                     "num_buckets, max_distance), relative_position = key − query = "
                     f"{T5_OFFSETS[0]}..{T5_OFFSETS[1]}"),
            "offsets": list(T5_OFFSETS), "cases": cases}


SINUSOID_CASES = [(16, 40), (15, 21), (64, 12)]  # (d_model, positions)


def sinusoidal_transformers() -> dict:
    import transformers
    from transformers.models.distilbert.modeling_distilbert import _create_sinusoidal_embeddings

    cases = [{"d_model": d, "positions": n,
              "embeddings": floats(_create_sinusoidal_embeddings(n, d, torch.empty(n, d)))} for d, n in SINUSOID_CASES]
    return {**header("transformers", transformers.__version__,
                     "models.distilbert.modeling_distilbert._create_sinusoidal_embeddings(n_pos, dim, out): Vaswani "
                     "et al.'s table, sin at even dims 2t and cos at odd dims 2t+1 of angle pos / 10000^(2t/dim) "
                     "(float64 in numpy, stored float32)"),
            "cases": cases}


def sinusoidal_x_transformers() -> dict:
    from x_transformers.x_transformers import ScaledSinusoidalEmbedding

    cases = []
    for d, n in [(16, 40), (64, 12)]:  # it needs an even width
        emb = ScaledSinusoidalEmbedding(d)
        cases.append({"d_model": d, "positions": n, "scale": floats(emb.scale.detach()[0]),
                      "embeddings": floats(emb(torch.zeros(1, n, d)))})
    return {**header("x-transformers", version("x-transformers"),
                     "ScaledSinusoidalEmbedding(dim)(x) for x of n positions: cat(sin, cos) of pos·10000^(−2t/dim) "
                     "times its learned scale (initially dim^−0.5)",
                     layout="half split: sin in dims 0..dim/2−1, cos in dims dim/2..; ours interleaves them "
                            "(sin at 2t, cos at 2t+1) and has no scale: the test permutes and divides"),
            "cases": cases}


def pope_x_transformers() -> dict:
    from x_transformers.x_transformers import PolarEmbedding, apply_polar_pos_emb

    cases = []
    for dim, heads, length, seed in [(8, 2, 8, 21), (16, 2, 6, 22)]:
        pope = PolarEmbedding(dim, heads)
        with torch.no_grad():
            phase = torch.rand(heads, 1, dim, generator=torch.Generator().manual_seed(seed))
            pope.learned_bias.copy_(-2 * math.pi * phase)
        q, k = randn(seed, 1, heads, length, dim), randn(seed + 100, 1, heads, length, dim)
        freqs, bias = pope(torch.arange(length))
        cases.append({"head_dim": dim, "heads": heads, "length": length, "phase": floats(pope.learned_bias[:, 0]),
                      "q": floats(q[0]), "k": floats(k[0]), "polar_q": floats(apply_polar_pos_emb(q, freqs)[0]),
                      "polar_k": floats(apply_polar_pos_emb(k, freqs + bias)[0])})
    return {**header("x-transformers", version("x-transformers"),
                     "PolarEmbedding(dim, heads) with its learned_bias set to seeded phases in [−2π, 0]: "
                     "freqs, bias = it(arange(length)); apply_polar_pos_emb(q, freqs) and apply_polar_pos_emb(k, "
                     "freqs + bias) of seeded float32 q, k (1, heads, length, dim)",
                     scale="ours multiplies q by √2 (relative_attention divides by √(2D), PoPE's logit by √D): "
                           "the test divides it out"),
            "cases": cases}


def positions_deepmind(commit: str) -> dict:
    """The position encodings of the reference's Transformer (models/positional_encodings.py)."""
    import jax.numpy as jnp
    from neural_networks_chomsky_hierarchy.models import positional_encodings as encodings

    sin_cos = [{"length": n, "hidden_size": d,
                "encodings": floats(encodings.sinusoid_position_encoding(n, d, causal=True))}
               for n, d in [(10, 16), (6, 64)]]
    rope = []
    for dim, length, seed in [(16, 10, 31), (8, 14, 32)]:
        x = randn(seed, 1, length, 2, dim)  # (batch, time, heads, dim), the reference's layout
        rotated = encodings.apply_rotary_encoding(jnp.asarray(x.numpy()), jnp.arange(length)[None, :])
        rope.append({"head_dim": dim, "length": length, "x": floats(x[0].transpose(0, 1)),
                     "rotated": floats(torch.from_numpy(np.array(rotated))[0].transpose(0, 1))})
    alibi = [{"heads": h, "length": 6, "slopes": floats(encodings._get_alibi_slopes(h)),
              "bias": floats(np.asarray(encodings.compute_alibi_encodings_biases((h, 6, 6))))} for h in (4, 6, 8)]
    return {**header("google-deepmind/neural_networks_chomsky_hierarchy", commit,
                     "models/positional_encodings.py of the reference's Transformer: sinusoid_position_encoding(L, D, "
                     "causal=True), which the model adds to the L input embeddings (its SIN_COS); "
                     "apply_rotary_encoding(x, arange(L)) (ROTARY) of seeded float32 x, stored (heads, L, D); "
                     "_get_alibi_slopes(h) and compute_alibi_encodings_biases((h, L, L)) (ALIBI, no causal mask)",
                     jax=version("jax"), numpy=np.__version__,
                     differences="SIN_COS: token t gets position L − t (its rows run L, L−1, .., 1), sin in the "
                                 "first D/2 dims and cos in the last: ours gives t position t and interleaves them. "
                                 "ROTARY: interleaved pairs (2t, 2t+1), ours the half split. ALIBI: it adds 0.5·slope "
                                 "to the keys behind the query (j < i) to tell left from right; ours is symmetric"),
            "sin_cos": sin_cos, "rope": rope, "alibi": alibi}


def training_deepmind(commit: str) -> dict:
    """The reference's loss (experiments/example.py) and its model's initial parameters (models/transformer.py)."""
    import haiku as hk
    import jax
    import jax.numpy as jnp
    from neural_networks_chomsky_hierarchy.models import transformer
    from neural_networks_chomsky_hierarchy.tasks.cs import binary_addition

    task = binary_addition.BinaryAddition()
    losses = []
    for length, seed in [(7, 41), (12, 42)]:
        random.seed(seed)  # the task draws with Python's and numpy's generators, not the key
        np.random.seed(seed)
        batch = task.sample_batch(jax.random.PRNGKey(seed), 4, length)
        logits = randn(seed, *batch["output"].shape)
        pointwise = task.pointwise_loss_fn(jnp.asarray(logits.numpy()), batch["output"])
        loss = jnp.mean(jnp.sum(pointwise, axis=-1))  # example.py's loss_fn, verbatim
        losses.append({"length": length, "target": ints(np.argmax(batch["output"], axis=-1)), "logits": floats(logits),
                       "loss": floats(np.asarray(loss, dtype=np.float64))})

    vocab, classes, seeds = 400, 12, 8
    model = hk.transform(transformer.make_transformer_encoder(output_size=classes, embedding_dim=64, num_layers=2,
                                                              num_heads=4, return_all_outputs=True))
    draws = [model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 6, vocab))) for seed in range(seeds)]
    parameters = []
    for module, values in draws[0].items():
        for name, value in values.items():
            pooled = np.concatenate([np.asarray(d[module][name], dtype=np.float64).ravel() for d in draws])
            parameters.append({"name": f"{module}/{name}", "shape": list(value.shape), "mean": floats(pooled.mean()),
                               "std": floats(pooled.std()), "max_abs": floats(np.abs(pooled).max())})
    dropout = {}
    for encodings in ("SIN_COS", "NONE"):
        calls, original = [], hk.dropout

        def recorded(rng, rate, x, calls=calls, original=original):
            calls.append([float(rate), int(x.shape[-1])])
            return original(rng, rate, x)

        positional = getattr(transformer.pos_encs_lib.PositionalEncodings, encodings)
        model = hk.transform(transformer.make_transformer_encoder(
            output_size=classes, embedding_dim=64, num_layers=2, num_heads=4, dropout_prob=0.1,
            return_all_outputs=True, positional_encodings=positional,
            positional_encodings_params=transformer.pos_encs_lib.SinCosParams()))  # unread under NONE
        x = jnp.zeros((2, 6, vocab))
        weights = model.init(jax.random.PRNGKey(0), x)
        transformer.hk.dropout = recorded
        try:
            model.apply(weights, jax.random.PRNGKey(1), x)
        finally:
            transformer.hk.dropout = original
        dropout[encodings.lower()] = calls
    return {**header("google-deepmind/neural_networks_chomsky_hierarchy", commit,
                     "loss: experiments/example.py's loss_fn, jnp.mean(jnp.sum(task.pointwise_loss_fn(output, target), "
                     "axis=-1)), on BinaryAddition().sample_batch(PRNGKey(seed), 4, length) after "
                     "random.seed(seed) and numpy.random.seed(seed) (target: its one-hot "
                     "output's classes, 2 the terminator and 0s after it) and seeded float32 logits; init: "
                     "hk.transform(make_transformer_encoder(output_size=12, embedding_dim=64, num_layers=2, "
                     "num_heads=4, return_all_outputs=True)).init(PRNGKey(s), zeros((1, 6, 400))) for s in 0..7, each "
                     "parameter's mean, std and max |value| over the 8 draws pooled, in the order Haiku creates "
                     "them; dropout: "
                     "the (rate, width) of each hk.dropout call of one training forward of that encoder with "
                     "dropout_prob=0.1, in call order, with sin/cos (SIN_COS) and without positions (NONE)",
                     jax=version("jax"), haiku=version("dm-haiku"), numpy=np.__version__),
            "loss": losses, "init": {"vocab": vocab, "classes": classes, "seeds": seeds, "parameters": parameters},
            "dropout": dropout}


MODEL_SIZE = {"embedding_dim": 8, "num_layers": 2, "num_heads": 2, "widening_factor": 4}
MODEL_LENGTHS = ((1, 61), (4, 62), (7, 63))  # (input length, seed): two examples each


def whole_model(transform, task, schemes: dict, lengths=MODEL_LENGTHS, record=None) -> dict:
    """The logits of a reference's encoder (`transform(positional_encodings, params)`, an
    hk.transform'ed model) on `task`'s examples, each length alone, for each scheme of `schemes`
    (label: (encodings, params)), all with one pool of parameters: the first scheme's initial
    parameters, and each later scheme's own parameters where a name is new, each plus N(0, 0.2²)
    noise (else layer norms and biases start constant and the logits would not see them). `record(scheme)`: a
    context that returns the random draws the apply made (Ruoss et al.'s schemes), or None."""
    import contextlib

    import jax
    import jax.numpy as jnp

    examples = []
    for length, seed in lengths:
        batch = task.sample_batch(jax.random.PRNGKey(seed), 2, length)
        examples.append({"length": length, "seed": seed, "input": np.asarray(batch["input"]).argmax(-1)})
    pool, out, noise = {}, {}, np.random.RandomState(7)
    for label, (encodings, params) in schemes.items():
        model = transform(encodings, params)
        longest = jax.nn.one_hot(jnp.asarray(examples[-1]["input"]), task.input_size)
        own = model.init(jax.random.PRNGKey(0), longest)
        names = []
        for module, values in own.items():
            for name, value in values.items():
                if f"{module}/{name}" not in pool:
                    pool[f"{module}/{name}"] = (np.asarray(value) + 0.2 * noise.standard_normal(value.shape)).astype(
                        np.float32)
                names.append(f"{module}/{name}")
        weights = {module: {name: jnp.asarray(pool[f"{module}/{name}"]) for name in values}
                   for module, values in own.items()}
        logits, draws = [], []
        for index, example in enumerate(examples):
            x = jax.nn.one_hot(jnp.asarray(example["input"]), task.input_size)
            with (record(label) if record else contextlib.nullcontext([])) as drawn:
                logits.append(floats(np.asarray(model.apply(weights, jax.random.PRNGKey(100 + index), x))))
            draws.append([ints(d) for d in drawn])
        out[label] = {"parameters": names, "logits": logits, **({"draws": draws} if record else {})}
    return {"model": MODEL_SIZE, "output_size": task.output_size, "input_size": task.input_size,
            "examples": [{"length": e["length"], "seed": e["seed"], "input": ints(e["input"])} for e in examples],
            "schemes": out,
            "pool": {name: {"shape": list(value.shape), "values": floats(value.ravel())}
                     for name, value in pool.items()}}


def model_deepmind(commit: str) -> dict:
    """Whole-model logits of the reference's encoder (Delétang et al.) under each of its encodings."""
    import haiku as hk
    from neural_networks_chomsky_hierarchy.experiments import utils
    from neural_networks_chomsky_hierarchy.models import transformer
    from neural_networks_chomsky_hierarchy.tasks.cs import bucket_sort

    task = bucket_sort.BucketSort()
    encs = transformer.pos_encs_lib
    schemes = {"none": ("NONE", encs.SinCosParams()), "sin_cos": ("SIN_COS", encs.SinCosParams()),
               "alibi": ("ALIBI", encs.SinCosParams()), "rope": ("ROTARY", encs.SinCosParams()),
               "transformer_xl": ("RELATIVE", encs.SinCosParams())}

    def transform(encodings, params):
        model = transformer.make_transformer_encoder(
            output_size=task.output_size, return_all_outputs=True, dropout_prob=0.0,
            positional_encodings=getattr(encs.PositionalEncodings, encodings), positional_encodings_params=params,
            **MODEL_SIZE)
        return hk.transform(utils.make_model_with_empty_targets(model, task, 0, False))

    return {**header("google-deepmind/neural_networks_chomsky_hierarchy", commit,
                     "experiments/example.py's model, hk.transform(make_model_with_empty_targets("
                     "make_transformer_encoder(output_size=5, return_all_outputs=True, dropout_prob=0.0, "
                     "embedding_dim=8, num_layers=2, num_heads=2, widening_factor=4, positional_encodings=E), "
                     "BucketSort(), 0, False)), applied to BucketSort().sample_batch(PRNGKey(seed), 2, length) one "
                     "length at a time, for E in NONE, SIN_COS, ALIBI, ROTARY, RELATIVE; the parameters: "
                     "init(PRNGKey(0)) of NONE's model, each later scheme's own init where a name is new "
                     "(Transformer-XL's), each plus N(0, 0.2²) noise from numpy's RandomState(7) in pool order, "
                     "stored flat in Haiku's (in, out) layout",
                     jax=version("jax"), haiku=version("dm-haiku"), numpy=np.__version__),
            **whole_model(transform, task, schemes)}


def positions_rpe(commit: str) -> dict:
    """Ruoss et al.'s noisy ALiBi (models/positional_encodings.py of randomized_positional_encodings)."""
    import haiku as hk
    import jax
    from randomized_positional_encodings.models import positional_encodings as encodings

    cases = []
    for heads, length, max_length, seed in [(4, 6, 20, 51), (8, 9, 64, 52)]:
        shape = (heads, length, length)
        draw = hk.transform(lambda shape=shape, m=max_length: encodings.compute_noisy_alibi_encodings_biases(shape, m))
        bias = np.asarray(draw.apply({}, jax.random.PRNGKey(seed)), dtype=np.float64)
        cases.append({"heads": heads, "length": length, "noise_max_length": max_length, "seed": seed,
                      "slopes": floats(encodings._get_alibi_slopes(heads)), "bias": floats(bias)})
    return {**header("google-deepmind/randomized_positional_encodings", commit,
                     "hk.transform(lambda: compute_noisy_alibi_encodings_biases((h, L, L), M)).apply({}, "
                     "PRNGKey(seed)): the encoder's noisy ALiBi (randomize_both_sides=False), h heads, L tokens, "
                     "distances drawn from [1, M)", jax=version("jax"), haiku=version("dm-haiku"),
                     numpy=np.__version__),
            "noisy_alibi": cases}


NOISE_MAX_LENGTH = 32


def model_rpe(commit: str) -> dict:
    """Whole-model logits of Ruoss et al.'s encoder under each of its encodings, noisy ones included,
    with the positions and distances each apply drew."""
    import contextlib

    import haiku as hk
    from randomized_positional_encodings.experiments import utils
    from randomized_positional_encodings.models import positional_encodings as encs, transformer
    from randomized_positional_encodings.tasks.cs import bucket_sort

    task = bucket_sort.BucketSort()
    m = NOISE_MAX_LENGTH
    schemes = {"none": ("NONE", encs.SinCosParams()), "sin_cos": ("SIN_COS", encs.SinCosParams()),
               "learned": ("LEARNT", encs.LearntParams(max_sequence_length=m)),
               "rope": ("ROTARY", encs.RotaryParams()), "alibi": ("ALIBI", encs.SinCosParams()),
               "transformer_xl": ("RELATIVE", encs.RelativeParams()),
               "sin_cos_randomized": ("NOISY_SIN_COS", encs.NoisySinCosParams(noise_max_length=m)),
               "learned_randomized": ("NOISY_LEARNT", encs.NoisyLearntParams(noise_max_length=m)),
               "rope_randomized": ("NOISY_ROTARY", encs.NoisyRotaryParams(noise_max_length=m)),
               "alibi_randomized": ("NOISY_ALIBI", encs.NoisyAlibiParams(noise_max_length=m)),
               "transformer_xl_randomized": ("NOISY_RELATIVE", encs.NoisyRelativeParams(noise_max_length=m))}

    def transform(encodings, params):
        model = transformer.make_transformer(
            output_size=task.output_size, transformer_module=transformer.TransformerEncoder,
            return_all_outputs=True, dropout_prob=None,
            positional_encodings=getattr(encs.PositionalEncodings, encodings), positional_encodings_params=params,
            **MODEL_SIZE)
        return hk.transform(utils.make_model_with_empty_targets(model, task, 0, False))

    @contextlib.contextmanager
    def record(label):
        """Every jax.random.choice the encodings make, sorted as they sort it: the drawn positions
        (noisy sin/cos, learned, RoPE, once a layer for each of q and k) or right-hand distances
        (noisy ALiBi and relative encodings, once a layer)."""
        drawn, original = [], encs.jrandom.choice

        def choice(*args, **kwargs):
            out = original(*args, **kwargs)
            drawn.append(np.sort(np.asarray(out)))
            return out

        encs.jrandom.choice = choice
        try:
            yield drawn
        finally:
            encs.jrandom.choice = original

    return {**header("google-deepmind/randomized_positional_encodings", commit,
                     "experiments/example.py's model, hk.transform(make_model_with_empty_targets(make_transformer("
                     "output_size=5, transformer_module=TransformerEncoder, return_all_outputs=True, "
                     "dropout_prob=None, embedding_dim=8, num_layers=2, num_heads=2, widening_factor=4, "
                     f"positional_encodings=E, positional_encodings_params=P), BucketSort(), 0, False)) with "
                     f"noise_max_length (and LEARNT's max_sequence_length) {m}, applied to "
                     "BucketSort().sample_batch(PRNGKey(seed), 2, length) one length at a time with "
                     "PRNGKey(100 + i) for the i-th length; draws: each jax.random.choice the apply made, sorted, "
                     "in call order; parameters as model_deepmind.json's (init(PRNGKey(0)) of the first scheme, "
                     "later schemes' new names from their own, plus N(0, 0.2²) noise from RandomState(7))",
                     jax=version("jax"), haiku=version("dm-haiku"), numpy=np.__version__),
            "noise_max_length": m, **whole_model(transform, task, schemes, record=record)}


SCHEME_FILES = {
    "rope_rotary_embedding_torch": rope_rotary_embedding_torch,
    "xpos_rotary_embedding_torch": xpos_rotary_embedding_torch,
    "rope_scaling_transformers": rope_scaling_transformers,
    "alibi_x_transformers": alibi_x_transformers,
    "t5_buckets_transformers": t5_buckets_transformers,
    "t5_buckets_x_transformers": t5_buckets_x_transformers,
    "sinusoidal_transformers": sinusoidal_transformers,
    "sinusoidal_x_transformers": sinusoidal_x_transformers,
    "pope_x_transformers": pope_x_transformers,
}


def reference_commit(given: str | None, package: str, option: str) -> str:
    """The commit of a DeepMind reference on the path: `given`, or read from its git checkout."""
    if given:
        return given
    import importlib

    folder = Path(importlib.import_module(package).__path__[0])
    try:
        return subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], check=True, capture_output=True,
                              text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sys.exit(f"{folder} is no git checkout: give the reference's commit with {option}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="file names without .json, or their beginnings (chomsky_: the "
                        "tasks); default: all")
    parser.add_argument("--deepmind-commit", help="the commit of neural_networks_chomsky_hierarchy on the path")
    parser.add_argument("--rpe-commit", help="the commit of randomized_positional_encodings on the path")
    args = parser.parse_args()
    torch.set_num_threads(1)

    def wanted(name: str) -> bool:
        return not args.only or any(name.startswith(prefix) for prefix in args.only)

    OUT.mkdir(parents=True, exist_ok=True)
    for name, make in SCHEME_FILES.items():
        if wanted(name):
            dump(name, make())
    deepmind = ["positions_deepmind", "training_deepmind", "model_deepmind",
                *(f"chomsky_{task}" for task in REFERENCE_TASKS)]
    if any(map(wanted, deepmind)):
        commit = reference_commit(args.deepmind_commit, "neural_networks_chomsky_hierarchy", "--deepmind-commit")
        if wanted("positions_deepmind"):
            dump("positions_deepmind", positions_deepmind(commit))
        if wanted("training_deepmind"):
            dump("training_deepmind", training_deepmind(commit))
        if wanted("model_deepmind"):
            dump("model_deepmind", model_deepmind(commit))
        if any(wanted(f"chomsky_{task}") for task in REFERENCE_TASKS):
            for name, obj in task_files(commit).items():
                if wanted(name):
                    dump(name, obj)
    if wanted("positions_rpe") or wanted("model_rpe"):
        commit = reference_commit(args.rpe_commit, "randomized_positional_encodings", "--rpe-commit")
        if wanted("positions_rpe"):
            dump("positions_rpe", positions_rpe(commit))
        if wanted("model_rpe"):
            dump("model_rpe", model_rpe(commit))


if __name__ == "__main__":
    main()
