"""The tasks and position schemes against golden files made by their peers, without the peers.

dev/golden/make_golden.py (dev only) runs the peer libraries on fixed, seeded inputs and writes
their outputs to tests/golden/*.json, each with the peer's name and version (the DeepMind reference
of Delétang et al. (2023): its commit). These tests read the files and compute the same things with
relpos_lab, so the suite fails the day a task or a scheme drifts from its reference:

- the 15 tasks: the reference generators' (input, output) pairs, as symbol indices, against the
  task's `output_of` (the reference pads outputs behind a termination token; it is stripped as the
  reference's accuracy_mask does, and our EOS stands for it). Odds first: `task.order=code` is the
  reference's, and the default (the paper's text) must differ from it exactly by the order of the
  two halves;
- RoPE, its linear and NTK scalings, xPos: rotary-embedding-torch; YaRN, linear and dynamic NTK
  frequencies: transformers (tests/test_rope_family.py also checks YaRN live, where transformers is
  installed); ALiBi slopes and bias, PoPE: x-transformers; T5's buckets: transformers and
  x-transformers; sinusoidal: transformers (DistilBERT's table) and x-transformers;
- the DeepMind reference's Transformer: its encodings (positions_deepmind.json), its loss and
  initial parameters (training_deepmind.json), and the whole encoder's logits under each of its
  encodings, each example alone and all in one padded batch (model_deepmind.json); Ruoss et al.'s
  noisy ALiBi (positions_rpe.json) and their whole encoder under each of their encodings, noisy ones
  at the draws their code made (model_rpe.json).

The peers compute in float32: values agree to 1e-5 (1e-6 for frequencies and slopes).
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from relpos_lab.api import EncoderOnly, builtin_config
from relpos_lab.api.registry import create_task, get_task_class
from relpos_lab.api.testing import tiny_model_config
from relpos_lab.core.attention.masks import offset_bias
from relpos_lab.core.loss import label_smoothed_loss
from relpos_lab.core.positions import (
    Alibi,
    AlibiConfig,
    AlibiPositions,
    PopePositions,
    RopeConfig,
    RotaryPositions,
    Sinusoidal,
    SinusoidalConfig,
    SinusoidalEmbedding,
    T5BiasConfig,
    T5BiasPositions,
    XposConfig,
    XposPositions,
    alibi_slopes,
)
from relpos_lab.launch.sweep import load_sweep

GOLDEN = Path(__file__).parent / "golden"
TASK_FILES = sorted(GOLDEN.glob("chomsky_*.json"))
SCHEME_FILES = sorted(set(GOLDEN.glob("*.json")) - set(TASK_FILES))
CHOMSKY_TASKS = ("even_pairs", "modular_arithmetic", "parity_check", "cycle_navigation", "stack_manipulation",
                 "reverse_string", "modular_arithmetic_brackets", "solve_equation", "duplicate_string",
                 "missing_duplicate_string", "odds_first_string", "binary_addition", "binary_multiplication",
                 "compute_sqrt", "bucket_sort")


@functools.lru_cache(maxsize=None)
def load(path: Path) -> dict:
    return json.loads(path.read_text())


def peer(golden: dict) -> str:
    return f"{golden['peer']} {golden['peer_version']}"


def close(actual, expected, golden: dict, what: str, atol: float = 1e-5, rtol: float = 0.0) -> None:
    expected = torch.as_tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(torch.as_tensor(actual).detach().double(), expected, atol=atol, rtol=rtol,
                               msg=lambda m: f"{what}, against {peer(golden)}:\n{m}")


def test_every_task_has_a_golden_file_and_every_scheme_file_a_check():
    assert [p.stem for p in TASK_FILES] == sorted(f"chomsky_{name}" for name in CHOMSKY_TASKS)
    assert {p.stem for p in SCHEME_FILES} == set(CHECKS)
    for path in TASK_FILES + SCHEME_FILES:
        golden = load(path)
        assert golden["peer"] and golden["peer_version"] and golden["computed"], path.name
        assert path.stat().st_size < 200_000, path.name


# --- the tasks of Delétang et al. (2023) --------------------------------------------------------

# The reference's symbol indices are ours in all 15 tasks (these tests check it): inputs, classes,
# and the digits of the sequence outputs. Should one differ, map it here: {task: {reference: ours}}.
INPUT_MAP: dict[str, dict[int, int]] = {}


def task(name: str, **fields):
    cls = get_task_class(name)
    return cls(cls.config_class(name=name, **fields))


def scored_output(raw: list[int], termination: int | None) -> list[int]:
    """The reference's output up to its termination token, without it (our EOS stands for it): the
    positions its accuracy_mask keeps, up to the first maximum symbol, less the token."""
    if termination is None:
        return raw
    end = raw.index(max(raw))
    assert raw[end] == termination, f"no termination token {termination} in the reference's output {raw}"
    return raw[:end]


def reference_pairs(golden: dict):
    mapping = INPUT_MAP.get(golden["task"], {})
    for group in golden["by_length"]:
        for source, raw in group["pairs"]:
            yield group["length"], [mapping.get(s, s) for s in source], raw


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: p.stem.removeprefix("chomsky_"))
def test_task_outputs_match_the_reference_generator(path):
    golden = load(path)
    name = golden["task"]
    ours = task(name, order="code") if name == "odds_first_string" else task(name)
    n_inputs = len(ours.inputs())
    for length, source, raw in reference_pairs(golden):
        where = f"{name}, length {length}, input {source}, against {peer(golden)}"
        assert all(0 <= s < n_inputs for s in source), f"{where}: a symbol outside our {n_inputs} inputs"
        assert ours.output_length(len(source)) == len(raw), f"{where}: output_length"
        want, got = scored_output(raw, golden["termination_token"]), ours.output_of(source)
        assert got == want, f"{where}: reference output {raw} (scored {want}), ours {got}"


def test_odds_first_by_default_puts_the_other_half_first_and_nothing_else():
    """The default (task.order=paper, the paper's text: s[0::2] + s[1::2]) against the reference's
    code (s[1::2] + s[0::2]): the reference's output with its two halves swapped."""
    golden = load(GOLDEN / "chomsky_odds_first_string.json")
    paper = task("odds_first_string")
    assert paper.cfg.order == "paper"
    differs = 0
    for length, source, raw in reference_pairs(golden):
        first = len(source) // 2  # the reference puts s[1::2] first: len(s) // 2 symbols
        want = raw[first:] + raw[:first]
        got = paper.output_of(source)
        assert got == want, (f"odds_first_string at the default order=paper, length {length}, input {source}: the "
                             f"reference's output {raw} ({peer(golden)}) with its halves swapped is {want}, ours {got}")
        differs += got != raw
    assert differs > 100  # most inputs of length > 1 tell the two orders apart


# --- position schemes ---------------------------------------------------------------------------


def half_split(dim: int) -> list[int]:
    """Interleaved pairs (2t, 2t+1) (rotary-embedding-torch, x-transformers) -> our half split
    (t, t + D/2): our dim t is their 2t, our t + D/2 their 2t + 1. Scores do not change."""
    return list(range(0, dim, 2)) + list(range(1, dim, 2))


def check_rope_rotary_embedding_torch(golden):
    for case in golden["cases"]:
        dim, p = case["head_dim"], half_split(case["head_dim"])
        module = RotaryPositions(dim, case["base"]).double()  # training mode: plain RoPE
        q, k = (torch.tensor(case[x], dtype=torch.float64)[..., p] for x in ("q", "k"))
        close(module.theta, case["theta"], golden, f"RoPE θ, {case['name']}", atol=0, rtol=1e-6)
        rq, rk = module.rotate(q, k, case["offset"])
        close(rq, torch.tensor(case["rotated_q"])[..., p], golden, f"RoPE q, {case['name']}")
        close(rk, torch.tensor(case["rotated_k"])[..., p], golden, f"RoPE k, {case['name']}")
    for case in golden["scaled"]:
        dim, p = case["head_dim"], half_split(case["head_dim"])
        cfg = RopeConfig(rope_scaling=case["scaling"], rope_scaling_factor=case["factor"], rope_train_length=1)
        module = RotaryPositions(dim, case["base"], cfg).double().eval()  # evaluation beyond 1 position: scaled
        q = torch.tensor(case["q"], dtype=torch.float64)[..., p]
        theta, factor = module.frequencies(q.shape[-2])
        if case["scaling"] == "linear":  # the peer divides the positions by s, we the frequencies
            theta = theta * case["factor"]
        close(theta, case["theta"], golden, f"RoPE θ, {case['name']}", atol=0, rtol=1e-6)
        assert factor == 1.0
        rq, _ = module.rotate(q, q, 0)
        close(rq, torch.tensor(case["rotated_q"])[..., p], golden, f"RoPE q, {case['name']}")


def check_xpos_rotary_embedding_torch(golden):
    for case in golden["cases"]:
        dim, p, length = case["head_dim"], half_split(case["head_dim"]), case["length"]
        module = XposPositions(dim, XposConfig(xpos_scale_base=case["scale_base"]), causal=True).double()
        q, k = (torch.tensor(case[x], dtype=torch.float64)[..., p] for x in ("q", "k"))
        rq, rk = module.rotate(q, k, 0)
        close(rq @ rk.transpose(-1, -2), case["scores"], golden, f"xPos scores, {case['name']}", rtol=1e-5)
        # The peer's exponent is (n − length // 2)/γ, ours n/γ: q is ours / ζ^(c/γ), k ours · ζ^(c/γ).
        centre = (module.zeta ** ((length // 2) / case["scale_base"])).repeat(2)
        close(rq / centre, torch.tensor(case["rotated_q"])[..., p], golden, f"xPos q, {case['name']}")
        close(rk * centre, torch.tensor(case["rotated_k"])[..., p], golden, f"xPos k, {case['name']}")


def check_rope_scaling_transformers(golden):
    for case in golden["cases"]:
        cfg = RopeConfig(rope_scaling=case["rope_scaling"], rope_scaling_factor=case["rope_scaling_factor"],
                         rope_train_length=case["rope_train_length"])
        theta, factor = RotaryPositions(case["head_dim"], case["base"], cfg).eval().frequencies(case["length"])
        close(theta, case["inv_freq"], golden, f"{case['name']} frequencies", atol=1e-6)
        assert factor == pytest.approx(case["attention_factor"], abs=1e-7), \
            f"{case['name']}: factor on q and k {factor}, {peer(golden)}'s attention_factor {case['attention_factor']}"


def check_alibi_x_transformers(golden):
    for case in golden["cases"]:
        heads, length = case["heads"], case["length"]
        close(alibi_slopes(heads), case["slopes"], golden, f"ALiBi slopes, {heads} heads", atol=0, rtol=1e-6)
        q = torch.zeros(1, heads, length, 1)
        kwargs = AlibiPositions(heads).attention_kwargs(q, q, 0)
        bias = offset_bias(kwargs["rel_bias"], length, length, kwargs["max_distance"])[0]  # (H, Lq, Lk)
        close(bias, case["bias"], golden, f"ALiBi bias, {heads} heads", atol=1e-6)


def check_t5_buckets(golden):
    lo, hi = golden["offsets"]
    offsets = torch.arange(lo, hi + 1)
    for case in golden["cases"]:
        cfg = T5BiasConfig(t5_num_buckets=case["num_buckets"], t5_max_distance=case["max_distance"])
        ours = T5BiasPositions(cfg, n_heads=1, bidirectional=case["bidirectional"]).bucket(offsets).tolist()
        wrong = [(o, a, b) for o, a, b in zip(offsets.tolist(), ours, case["buckets"]) if a != b]
        assert not wrong, (f"T5 buckets (num_buckets {case['num_buckets']}, max_distance {case['max_distance']}, "
                           f"bidirectional {case['bidirectional']}) against {peer(golden)}: (offset j − i, ours, "
                           f"theirs) {wrong[:10]}")


def check_sinusoidal_transformers(golden):
    for case in golden["cases"]:
        d, n = case["d_model"], case["positions"]
        close(SinusoidalEmbedding(d)(torch.zeros(1, n, d))[0], case["embeddings"], golden, f"sinusoids, d_model {d}")


def check_sinusoidal_x_transformers(golden):
    for case in golden["cases"]:
        d, n = case["d_model"], case["positions"]
        # Theirs: sin in dims 0..d/2−1, cos in d/2.., times a scale; ours interleaves sin (2t) and cos (2t+1).
        interleaved = [i // 2 + (d // 2) * (i % 2) for i in range(d)]
        theirs = torch.tensor(case["embeddings"], dtype=torch.float64)[:, interleaved] / case["scale"]
        close(SinusoidalEmbedding(d)(torch.zeros(1, n, d))[0], theirs, golden, f"sinusoids, d_model {d}")


def check_pope_x_transformers(golden):
    for case in golden["cases"]:
        module = PopePositions(case["head_dim"], case["heads"], 10000.0).double()
        with torch.no_grad():
            module.phase.copy_(torch.tensor(case["phase"]))
        q, k = (torch.tensor(case[x], dtype=torch.float64) for x in ("q", "k"))
        rq, rk = module.rotate(q, k, 0)
        close(rq / math.sqrt(2), case["polar_q"], golden, f"PoPE q, head dim {case['head_dim']}")
        close(rk, case["polar_k"], golden, f"PoPE k, head dim {case['head_dim']}")


def check_positions_deepmind(golden):
    """The encodings of the reference's Transformer (Delétang et al.): RoPE is ours (up to the dims'
    order); its sin/cos and ALiBi are ours with the options the paper configs turn on
    (model.positions.count_from_end, left_offset=0.5), and differ from our defaults as
    golden["differences"] says."""
    for case in golden["sin_cos"]:
        n, d = case["length"], case["hidden_size"]
        interleaved = [i // 2 + (d // 2) * (i % 2) for i in range(d)]
        theirs = torch.tensor(case["encodings"], dtype=torch.float64)[:, interleaved]
        from_end = Sinusoidal(SinusoidalConfig(count_from_end=True)).embedding(d)
        close(from_end(torch.zeros(1, n, d, dtype=torch.float64))[0], theirs, golden,
              f"sin/cos counted from the end, D = {d}")
        # Their row t, the encoding of token t, is position n − t: ours, by default, at n, n − 1, .., 1.
        ours = SinusoidalEmbedding(d)(torch.zeros(1, n + 1, d))[0]  # positions 0..n
        close(ours.flip(0)[:n], theirs, golden, f"sin/cos of token t at position {n} − t, D = {d}")
    for case in golden["rope"]:
        dim, p = case["head_dim"], half_split(case["head_dim"])
        x = torch.tensor(case["x"], dtype=torch.float64)[..., p]
        rotated, _ = RotaryPositions(dim, 10000.0).double().rotate(x, x, 0)
        close(rotated, torch.tensor(case["rotated"])[..., p], golden, f"RoPE, head dim {dim}")
    for case in golden["alibi"]:
        heads, length = case["heads"], case["length"]
        close(alibi_slopes(heads), case["slopes"], golden, f"ALiBi slopes, {heads} heads", atol=0, rtol=1e-6)
        q = torch.zeros(1, heads, length, 1)
        theirs = torch.tensor(case["bias"], dtype=torch.float64)

        def bias(positions):
            kwargs = positions.attention_kwargs(q, q, 0)
            return offset_bias(kwargs["rel_bias"], length, length, kwargs["max_distance"])[0]  # (H, Lq, Lk)

        left = Alibi(AlibiConfig(left_offset=0.5)).attention(1, heads, causal=False)
        close(bias(left), theirs, golden, f"ALiBi with left_offset=0.5, {heads} heads", atol=1e-6)
        behind = torch.ones(length, length, dtype=torch.float64).tril(-1)  # keys j < i: theirs adds 0.5·slope
        slopes = torch.tensor(case["slopes"], dtype=torch.float64)[:, None, None]
        close(bias(AlibiPositions(heads)), theirs - 0.5 * behind * slopes, golden,
              f"ALiBi bias less 0.5·slope behind the query, {heads} heads", atol=1e-6)


def check_positions_rpe(golden):
    """Ruoss et al.'s noisy ALiBi: offset j − i stands for a distance drawn from [1, M), sorted, the
    left side the right's mirror. Ours at their draw (`attention_kwargs_at_distances`, left_offset
    0.5 as the Ruoss sweeps set it) is their bias; the draw is read off their first row."""
    for case in golden["noisy_alibi"]:
        heads, n = case["heads"], case["length"]
        theirs = torch.tensor(case["bias"], dtype=torch.float64)
        right = -theirs[0, 0, 1:] / case["slopes"][0]  # query 0's keys j > 0: the draw, increasing
        drawn = right.round()
        close(right, drawn, golden, "their distances, integers", atol=1e-4)
        assert bool((drawn.diff() > 0).all()) and drawn.min() >= 1 and drawn.max() < case["noise_max_length"]
        distances = torch.cat([-drawn.flip(0), torch.zeros(1), drawn])
        q = torch.zeros(1, heads, n, 1)
        kwargs = Alibi(AlibiConfig(left_offset=0.5)).attention(1, heads, causal=False).attention_kwargs_at_distances(
            q, q, distances)
        close(offset_bias(kwargs["rel_bias"], n, n, kwargs["max_distance"])[0], theirs, golden,
              f"noisy ALiBi, {heads} heads, {n} tokens, distances {drawn.int().tolist()}", atol=1e-5)


def check_training_deepmind(golden):
    """The reference's loss and initial parameters (Delétang et al.'s code): `task.loss_on_padding` is
    its loss, a mean over every output slot, the 0s after the terminator included; `model.init=haiku`
    with the paper configs' biases gives its model's parameters, one for one, drawn alike; the paper
    sweep's cells drop where its encoder does (the embeddings only under sin/cos)."""
    addition = task("binary_addition")
    for case in golden["loss"]:
        target = torch.tensor(case["target"])
        assert addition.output_length(case["length"]) == target.shape[1]  # its slots are ours
        ours = label_smoothed_loss(torch.tensor(case["logits"]), target, smoothing=0.0,
                                   counted=torch.ones_like(target, dtype=torch.bool))
        close(ours.loss, case["loss"], golden, f"the loss at length {case['length']}", atol=1e-6)
    init = golden["init"]
    torch.manual_seed(0)
    model = EncoderOnly(tiny_model_config(builtin_config("sinusoidal"), "encoder_only", vocab=init["classes"],
                                          src_vocab_size=init["vocab"], d_model=64, d_ff=256, n_heads=4,
                                          n_encoder_layers=2, init="haiku", attention_bias=False, output_bias=True))
    ours = list(model.named_parameters())
    assert len(ours) == len(init["parameters"]), [name for name, _ in ours]
    for (name, value), theirs in zip(ours, init["parameters"]):
        value = value.detach().double()
        value = value[1:] if name == "encoder.embed.tokens.weight" else value  # row 0: our pad, theirs has none
        value = value.T if value.dim() == 2 and name != "encoder.embed.tokens.weight" else value  # Haiku: (in, out)
        what = f"{name} as {theirs['name']}"
        assert list(value.shape) == theirs["shape"], what
        if theirs["std"] == 0:
            assert bool((value == theirs["mean"]).all()), what
            continue
        assert value.std().item() == pytest.approx(theirs["std"], rel=0.05), what
        assert abs(value.mean().item() - theirs["mean"]) < 4 * theirs["std"] / value.numel() ** 0.5, what
        assert value.abs().max().item() <= 1.01 * theirs["max_abs"], what
    sweep = load_sweep("deletang2023_paper_small", only=0)
    cells = {point.labels["scheme"]: point.index for point in reversed(sweep.points)}
    for label, theirs in [("sin_cos", golden["dropout"]["sin_cos"]), ("none", golden["dropout"]["none"])]:
        cfg = sweep.config(cells[label])
        model = create_task(OmegaConf.to_object(cfg.task), seed=0).build_model(OmegaConf.to_object(cfg.model))
        calls = []
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.register_forward_hook(lambda m, args, out: calls.append([m.p, out.shape[-1]]) if m.p else None)
        model.train()(torch.tensor([[3, 4, 5]]), torch.tensor([2]))
        assert cfg.model.attention_dropout == 0 and calls == theirs, (label, calls)  # only modules drop


def reference_cell(sweep: str, label: str, golden: dict, task_name: str):
    """The model of `sweep`'s `label` cell at the golden's size, on `task_name`, in eval mode (with
    the golden's noise_max_length as its max_random_len and its learned positions' max_len)."""
    loaded = load_sweep(sweep, only=0)
    cfg = loaded.config(next(p.index for p in loaded.points if p.labels["scheme"] == label))
    size = golden["model"]
    cfg.task.name = task_name
    cfg.model.d_model, cfg.model.n_heads = size["embedding_dim"], size["num_heads"]
    cfg.model.d_ff, cfg.model.n_encoder_layers = size["embedding_dim"] * size["widening_factor"], size["num_layers"]
    if "noise_max_length" in golden:
        if cfg.model.positions.max_random_len is not None:
            cfg.model.positions.max_random_len = golden["noise_max_length"]
        if "max_len" in cfg.model.positions:
            cfg.model.positions.max_len = golden["noise_max_length"]
    built = create_task(OmegaConf.to_object(cfg.task), seed=0)
    return built, built.build_model(OmegaConf.to_object(cfg.model)).eval()


def their_name(ours: str, theirs: list[str]) -> str:
    """The Haiku name, among `theirs`, of one of our encoder-only model's parameters in a reference's
    encoder: post-norm layers, attention of bias-free linears (q, k, v, Transformer-XL's W_R, out), the
    FFN's two biased linears numbered on from the token embedding's when it is a plain linear too, a
    biased head."""
    parts = ours.split(".")
    embedding = theirs[0]  # the first parameter either reference creates
    if ours == "encoder.embed.tokens.weight":
        return embedding
    if parts[:3] == ["encoder", "embed", "absolute"]:
        return next(name for name in theirs if name.endswith("embed/embeddings"))
    leaf = {"weight": "w", "bias": "b"}.get(parts[-1], parts[-1])
    if parts[0] == "output":
        return f"linear/{leaf}"
    layer, sublayer, module = int(parts[2]), parts[3], parts[-2]
    numbered = lambda base, i: base + (f"_{i}" if i else "")  # noqa: E731 -- Haiku's names: x, x_1, x_2, ...
    if module == "norm":
        return numbered("transformer_encoder/layer_norm", 2 * layer + (sublayer == "ffn")) + (
            "/scale" if leaf == "w" else "/offset")
    if sublayer == "ffn":
        first = 1 if embedding == "transformer_encoder/linear/w" else 0
        return numbered("transformer_encoder/linear", first + 2 * layer + (module == "fc2")) + f"/{leaf}"
    attention = numbered("transformer_encoder/multi_head_dot_product_attention", layer)
    if leaf in ("u", "v"):
        return f"{attention}/relpos_{'contentbias' if leaf == 'u' else 'relativebias'}"
    linears = 5 if f"{attention}/relpos_contentbias" in theirs else 4
    index = {"q_proj": 0, "k_proj": 1, "v_proj": 2, "r_proj": 3, "out_proj": linears - 1}[module]
    return numbered(f"{attention}/linear", index) + "/w"


def load_reference_parameters(model, golden: dict, scheme: dict, *, symbol_ids: list[int], slot_id: int,
                              class_ids: list[int], model_dims: list[int], head_dims: list[int],
                              sine_sign: float = 1.0) -> None:
    """Set `model`'s parameters to the golden's pool, named as `scheme["parameters"]` lists them.
    Our row of symbol s is their row s (`symbol_ids`), the slot their last; our model dimension i is
    their `model_dims[i]`, our query/key dimension j of a head their `head_dims[j]`: a relabelling of
    dimensions, which changes no output. `sine_sign` -1: their Transformer-XL encodes the distance
    j − i where ours encodes i − j, the same model with W_R's sine columns negated."""
    pool, names = golden["pool"], scheme["parameters"]
    heads, head_dim = golden["model"]["num_heads"], len(head_dims)
    within = torch.tensor([h * head_dim + j for h in range(heads) for j in head_dims])
    d = torch.tensor(model_dims)
    ours = dict(model.named_parameters())
    assert len(ours) == len(names), (sorted(ours), names)
    with torch.no_grad():
        for name, value in ours.items():
            key = their_name(name, names)
            assert key in names, (name, key)
            theirs = torch.tensor(pool[key]["values"], dtype=torch.float32).view(pool[key]["shape"])
            module, leaf = name.split(".")[-2:]
            if name == "encoder.embed.tokens.weight":
                value[symbol_ids + [slot_id]] = theirs[:, d]
            elif module == "output":
                value.zero_()
                value[class_ids] = theirs[d].T if leaf == "weight" else theirs
            elif module in ("q_proj", "k_proj"):
                value.copy_(theirs[d][:, within].T)
            elif module in ("v_proj", "fc1"):
                value.copy_(theirs[d].T if leaf == "weight" else theirs)
            elif module in ("out_proj", "fc2", "norm"):
                value.copy_(theirs[:, d].T if leaf == "weight" and module != "norm" else theirs[d])
            elif module == "r_proj":
                value.copy_(theirs[:, within].T)
                value[:, :value.shape[1] // 2] *= sine_sign
            elif module == "embedding":  # learned positions
                value.copy_(theirs[:, d])
            else:  # Transformer-XL's u and v, added to the queries
                value.copy_(theirs[:, head_dims])


def replay_draws(model, draws: list[list[list[int]]], lengths: list[int], label: str) -> None:
    """Make `model` draw what the reference drew (Ruoss et al.'s noisy encodings): for a pass over n
    tokens, the draws of the example whose input and slots make n, in the order our stack asks for
    them. Their noisy RoPE draws once for q and once for k of each layer, from one key (the same draw):
    ours draws once for the embedding, used by layer 0, then once for each later layer."""
    embed = model.encoder.embed
    queues: dict[int, list[torch.Tensor]] = {}
    for length, drawn in zip(lengths, draws):
        drawn = [torch.tensor(x) for x in drawn]
        if label.startswith("rope"):
            assert all(torch.equal(q, k) for q, k in zip(drawn[::2], drawn[1::2])), "q's and k's draws differ"
            drawn = drawn[::2]
        queues[2 * length] = drawn  # bucket sort: as many slots as input tokens
    calls: dict[int, int] = {}

    def replayed(n):
        calls[n] = calls.get(n, 0) + 1
        return queues[n][(calls[n] - 1) % len(queues[n])]

    if embed.random_distances:
        embed.random_distances_of = lambda n, draws=None, lengths=None: (lambda right: torch.cat(
            (-right.flip(0), right.new_zeros(1), right)))(replayed(n))
    else:
        embed.random_positions = lambda n, draws=None: replayed(n)


def check_whole_model(golden, sweep: str, sine_sign: float = 1.0):
    """The whole reference encoder: each scheme's cell of `sweep`, at the golden's size with the
    golden's parameters (and, randomized, the reference's draws), gives the reference's logits on
    each example alone, and on all of them in one right-padded batch of mixed lengths."""
    size = golden["model"]
    d, head_dim = size["embedding_dim"], size["embedding_dim"] // size["num_heads"]
    interleaved = [i // 2 + (d // 2) * (i % 2) for i in range(d)]  # their sin/cos halves, our pairs
    for label, scheme in golden["schemes"].items():
        built, model = reference_cell(sweep, label, golden, "bucket_sort")
        symbols = [built.src_vocab.index[str(s)] for s in range(golden["input_size"])]
        classes = [built.tgt_vocab.index[str(c)] for c in range(golden["output_size"])]
        load_reference_parameters(model, golden, scheme, symbol_ids=symbols, slot_id=model.slot_id,
                                  class_ids=classes, model_dims=interleaved, head_dims=half_split(head_dim),
                                  sine_sign=sine_sign)
        if scheme.get("draws") and any(scheme["draws"]):
            replay_draws(model, scheme["draws"], [e["length"] for e in golden["examples"]], label)
        rows, expected = [], []
        for example, theirs in zip(golden["examples"], scheme["logits"]):
            src = torch.tensor(symbols)[torch.tensor(example["input"])]
            with torch.no_grad():
                alone = model(src, torch.full((src.shape[0],), src.shape[1]))[..., classes]
            close(alone, theirs, golden, f"{label}: logits at length {example['length']}", atol=2e-5)
            rows += list(src)
            expected += theirs
        width = max(len(r) for r in rows)
        batch = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
        with torch.no_grad():
            padded = model(batch, torch.tensor([len(r) for r in rows]))[..., classes]
        for i, (row, theirs) in enumerate(zip(rows, expected)):
            close(padded[i, :len(row)], theirs, golden, f"{label}: row {i} of a padded batch", atol=2e-5)


def check_model_deepmind(golden):
    """Delétang et al.'s encoder against the deletang2023_paper_small sweep's cells."""
    check_whole_model(golden, "deletang2023_paper_small")


def check_model_rpe(golden):
    """Ruoss et al.'s encoder against the ruoss2023_paper_small sweep's cells, noisy ones included. Their
    Transformer-XL reads R at j − i, Delétang et al.'s (and ours) at i − j."""
    check_whole_model(golden, "ruoss2023_paper_small", sine_sign=-1.0)


CHECKS = {
    "rope_rotary_embedding_torch": check_rope_rotary_embedding_torch,
    "xpos_rotary_embedding_torch": check_xpos_rotary_embedding_torch,
    "rope_scaling_transformers": check_rope_scaling_transformers,
    "alibi_x_transformers": check_alibi_x_transformers,
    "t5_buckets_transformers": check_t5_buckets,
    "t5_buckets_x_transformers": check_t5_buckets,
    "sinusoidal_transformers": check_sinusoidal_transformers,
    "sinusoidal_x_transformers": check_sinusoidal_x_transformers,
    "pope_x_transformers": check_pope_x_transformers,
    "positions_deepmind": check_positions_deepmind,
    "training_deepmind": check_training_deepmind,
    "model_deepmind": check_model_deepmind,
    "model_rpe": check_model_rpe,
    "positions_rpe": check_positions_rpe,
}


@pytest.mark.parametrize("path", SCHEME_FILES, ids=lambda p: p.stem)
def test_scheme_matches_its_peer(path):
    CHECKS[path.stem](load(path))
