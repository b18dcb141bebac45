"""Causal-only position schemes and per-key state rewritten as queries arrive.

The plugin is tests/running_sum_scheme.py (selective attention's running sums): it declares
`supports_bidirectional = False` and its `attention(causal=False)` refuses. For the CLI it is a
real distribution on the subprocess's path (a .dist-info with its entry point, as pip would leave
it), found through the `relpos_lab.positions` entry points like any other.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from relpos_lab.api import KeyState, PositionConfig, PositionScheme, RelativePositions
from relpos_lab.api.testing import ALONE, DECODING_CHECKS, RANDOMIZED, SLOTS, check_scheme
from relpos_lab.core.encoder_only import EncoderOnly
from relpos_lab.core.positions import builtin_config
from relpos_lab.core.prefix_lm import PrefixLM
from relpos_lab.core.transformer import DecoderLM, EncoderDecoder, ModelConfig

from installed import install_scheme, run_cli
from running_sum_scheme import RunningSumConfig, RunningSumScheme

TINY_SEQ2SEQ = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 6], train_size: 256, eval_size_per_length: 2}
trainer: {max_steps: 4, val_every_n_steps: 4}
logging: {root: runs}
"""
TINY_LM = ["lm_builtin", "debug", "task.subword.vocab_size=400", "task.train_length=16", "task.eval_lengths=[16,32]",
           "task.eval_tokens=600", "trainer.max_steps=4", "trainer.val_every_n_steps=4", "model.dropout=0.0",
           "model.attention_dropout=0.0", "logging.root=runs"]
REFUSED = ("relpos-lab: error: {where}: position scheme 'running_sum' (running_sum_scheme.RunningSumScheme) is "
           "causal-only (supports_bidirectional = False), and {setting} builds {layers} with bidirectional "
           "self-attention; use model.architecture=decoder_only with model.bidirectional_prefix=false, or another "
           "scheme")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A working directory whose subprocesses have running_sum installed as a distribution."""
    root = tmp_path_factory.mktemp("causal_only")
    install_scheme(root / "site", "running-sum", "running_sum_scheme",
                   Path(__file__).with_name("running_sum_scheme.py").read_text(),
                   "running_sum = running_sum_scheme:RunningSumScheme")
    (root / "tiny.yaml").write_text(TINY_SEQ2SEQ)
    return root


def run_dirs(root: Path) -> list[Path]:
    return sorted(p for p in (root / "runs").glob("*/*") if p.is_dir()) if (root / "runs").exists() else []


# --- config time: only the layer kinds the model has are built; bidirectional ones refuse -------------


def model_config(**fields) -> ModelConfig:
    fields = {"src_vocab_size": 12, "tgt_vocab_size": 12, "d_model": 16, "n_heads": 2, "d_ff": 32,
              "n_encoder_layers": 1, "n_decoder_layers": 2, "dropout": 0.0, "attention_dropout": 0.0, **fields}
    return ModelConfig(positions=fields.pop("positions", RunningSumConfig()), **fields)


@dataclass
class RecordingConfig(PositionConfig):
    scheme: str = "recording"


class RecordingBias(RelativePositions):
    def attention_kwargs(self, q, k, query_offset):
        return {}


class RecordingScheme(PositionScheme):
    """A scheme that keeps the `causal` of every attention() the core asks it for."""

    config_class = RecordingConfig
    asked: list = []

    def attention(self, head_dim, n_heads, causal):
        RecordingScheme.asked.append(causal)
        return RecordingBias()


@pytest.mark.parametrize("fields, kinds", [
    ({}, [False, True]),
    ({"architecture": "decoder_only"}, [True]),
    ({"architecture": "decoder_only", "bidirectional_prefix": True}, [False]),
    ({"architecture": "encoder_only"}, [False]),
])
def test_validation_builds_only_the_kinds_of_self_attention_layer_the_model_has(fields, kinds):
    cfg = model_config(positions=RecordingConfig(), **fields)
    assert list(cfg.self_attention_causal) == kinds
    RecordingScheme.asked = []
    cfg.validate()
    assert RecordingScheme.asked == kinds


def test_a_causal_only_scheme_builds_decoder_only_models_without_a_bidirectional_layer():
    assert RunningSumScheme.supports_bidirectional is False
    DecoderLM(model_config(architecture="decoder_only"))
    PrefixLM(model_config(architecture="decoder_only"))


@pytest.mark.parametrize("fields, setting", [
    ({}, "model.architecture=encoder_decoder"),
    ({"architecture": "decoder_only", "bidirectional_prefix": True}, "model.bidirectional_prefix=true"),
    ({"architecture": "encoder_only"}, "model.architecture=encoder_only"),
])
def test_a_model_with_a_bidirectional_layer_refuses_a_causal_only_scheme_in_one_line(fields, setting):
    model = {None: EncoderDecoder, "decoder_only": PrefixLM, "encoder_only": EncoderOnly}[fields.get("architecture")]
    with pytest.raises(ValueError) as err:
        model(model_config(**fields))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("position scheme 'running_sum' (running_sum_scheme.RunningSumScheme) is causal-only "
                              "(supports_bidirectional = False), and " + setting)


# --- the CLI: trains where every layer is causal, refuses before any run directory elsewhere ---------


def test_a_causal_only_scheme_trains_lm_builtin(root, tmp_path_factory):
    data = tmp_path_factory.mktemp("lm-data")
    out = run_cli(root, "train", *TINY_LM, f"task.data_dir={data}", "model.positions.scheme=running_sum")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run,) = [p for p in run_dirs(root) if p.parent.name == "lm_builtin"]
    assert (run / "results.json").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert "scheme: running_sum" in (run / "config.yaml").read_text()


def test_a_causal_only_scheme_trains_decoder_only_seq2seq(root):
    out = run_cli(root, "train", "tiny.yaml", "model.positions.scheme=running_sum", "model.architecture=decoder_only")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run,) = [p for p in run_dirs(root) if p.parent.name == "tiny"]
    assert (run / "results.json").is_file()
    assert "architecture: decoder_only" in (run / "config.yaml").read_text()


@pytest.mark.parametrize("overrides, where, setting, layers", [
    ([], "config", "model.architecture=encoder_decoder", "the encoder's layers"),  # the schema's default
    (["model.architecture=decoder_only", "model.bidirectional_prefix=true"], "command line",
     "model.bidirectional_prefix=true", "every decoder layer, whose source attends to all of itself,"),
])
def test_bidirectional_models_refuse_it_in_one_line_before_any_run_directory(tmp_path, root, overrides, where, setting,
                                                                             layers):
    work = tmp_path / "work"
    shutil.copytree(root, work, ignore=shutil.ignore_patterns("runs"))
    out = run_cli(work, "train", "tiny.yaml", "model.positions.scheme=running_sum", *overrides)
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]  # a config error, as every one
    assert out.stderr == REFUSED.format(where=where, setting=setting, layers=layers) + "\n", out.stderr[-3000:]
    assert "Run directory" not in out.stdout
    assert not (work / "runs").exists(), list((work / "runs").rglob("*"))


# --- the conformance kit skips the families it does not support, and says so ---------------------


def test_the_kit_passes_a_causal_only_scheme_skipping_the_encoder_decoder_checks():
    report = check_scheme(RunningSumScheme)
    report.raise_on_failure()
    skipped = [c.name for c in report.skipped]
    assert skipped == ["encoder_decoder: builds",
                       "encoder_only: builds",
                       "encoder_decoder: output shape, finite gradients reaching the scheme's parameters",
                       "encoder_decoder: cached decoding and multi-token prefill equal the full pass (float64)",
                       *DECODING_CHECKS["encoder_decoder"],
                       f"encoder_decoder: {ALONE}",
                       "encoder_decoder: 40 training steps lower the loss on one batch",
                       "encoder_only: output shape, finite gradients reaching the scheme's parameters",
                       *SLOTS,
                       f"encoder_only: {ALONE}",
                       "encoder_only: 40 training steps lower the loss on one batch",
                       *DECODING_CHECKS["decoder_only, bidirectional_prefix=true"],
                       RANDOMIZED]  # positions_from_content: randomized positions are refused
    ran = {c.name: c.detail for c in report.checks if not c.skipped}
    assert "max difference" in ran["decoder_only: cached decoding and multi-token prefill equal the full pass "
                                   "(float64)"]
    assert all("max difference" in ran[name] for name in DECODING_CHECKS["decoder_only"])
    assert report.summary() == "11 passed, 0 failed, 15 skipped"


@pytest.mark.slow  # ~30 s; the kit's CLI is test_conformance's, in the default tier
def test_check_scheme_on_the_command_line_prints_what_it_skipped(root):
    out = run_cli(root, "check-scheme", "running_sum")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    skips = [line for line in lines if line.startswith("skip  ") and RANDOMIZED not in line]  # its content counts
    assert len(skips) == 14 and all(line.startswith(("skip  encoder_decoder: ", "skip  encoder_only: ",
                                                      "skip  decoder_only, bidirectional_prefix=true: "))
                                   for line in skips)
    assert all("not run: the scheme declares supports_bidirectional = False" in line for line in skips)
    assert any(line.startswith("ok    decoder_only: cached decoding") for line in lines)
    assert lines[-1] == "10 passed, 0 failed, 15 skipped"
    listed = run_cli(root, "positions").stdout
    (row,) = [line for line in listed.splitlines() if "running_sum_scheme:RunningSumScheme" in line]
    assert "(selective attention, Leviathan et al., 2024). (causal only: decoder-only models without" in row


# --- KeyState: appended per key, or rewritten per key; beam search reorders both -------------------


def test_replace_rewrites_every_keys_entry_and_reorder_keeps_the_chosen_rows():
    state = KeyState()
    state.append(torch.tensor([[[1.0]], [[2.0]]]))  # (B=2, H=1, Lk=1)
    got = state.replace(torch.tensor([[[5.0, 6.0]], [[7.0, 8.0]]]))  # every key, the cached one rewritten
    assert got.tolist() == state.value.tolist() == [[[5.0, 6.0]], [[7.0, 8.0]]]
    state.reorder(torch.tensor([1, 1, 0]))
    assert state.value.tolist() == [[[7.0, 8.0]], [[7.0, 8.0]], [[5.0, 6.0]]]
    with pytest.raises(ValueError, match=r"expected \(B, H, Lk, \.\.\.\) with the same B, H .* Lk >= 2"):
        state.replace(torch.zeros(3, 1, 1))  # only the new key's part: the cached keys' sums would be lost


@pytest.mark.parametrize("architecture", ["lm", "prefix_lm"])
def test_a_state_of_either_kind_survives_a_beam_reorder(architecture):
    """Cached decoding with a beam-search reorder in the middle equals the full pass over the chosen
    rows, for a state rewritten per key (running_sum: replace) and one appended per key (fox)."""
    for positions in (RunningSumConfig(), builtin_config("fox")):
        torch.manual_seed(0)
        cfg = model_config(positions=positions, architecture="decoder_only")
        model = (DecoderLM(cfg) if architecture == "lm" else PrefixLM(cfg)).double().eval()
        src, tokens = torch.randint(3, 12, (3, 5)), torch.randint(3, 12, (3, 8))
        index = torch.tensor([2, 0, 0, 1])
        with torch.no_grad():
            cache = model.start_decoding() if architecture == "lm" else model.start_decoding(src)
            model.decode_step(tokens[:, :3], cache)
            model.decode_step(tokens[:, 3:5], cache)
            cache.reorder(index)
            cached = torch.cat([model.decode_step(tokens[index, 5:6], cache),
                                model.decode_step(tokens[index, 6:], cache)], 1)
            full = model(tokens[index]) if architecture == "lm" else model(src[index], tokens[index])
        keys = tokens.shape[1] + (0 if architecture == "lm" else src.shape[1])
        assert cache.layers[0].self_attn.state.value.shape[:3] == (4, 2, keys), positions.scheme
        torch.testing.assert_close(cached, full[:, 5:], atol=1e-12, rtol=0, msg=positions.scheme)
