"""Plugins that break their contract are told so in one line, where they break it.

Position schemes: a scheme that would add no positions (a misnamed hook) is refused when the
model is built; what a hook returns is checked on its first call. Tasks: what each verb returns is
checked on its first use. Every plugin here is deliberately broken in one way.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from importlib.metadata import EntryPoint

import pytest
import torch
from torch import nn

from relpos_lab.api import (
    KeyState,
    LossOutput,
    Pair,
    PositionConfig,
    PositionScheme,
    RelativePositions,
    Seq2SeqTask,
    TaskConfig,
    Vocabulary,
    registry,
)
from relpos_lab.api.contract import Checked, check
from relpos_lab.api.errors import ConfigError
from relpos_lab.core.positions import BUILTIN, builtin_config, contract
from relpos_lab.core.transformer import DecoderLM, EncoderDecoder, ModelConfig

# --- deliberately broken position schemes ---------------------------------------------------------


@dataclass
class TypoHookConfig(PositionConfig):
    scheme: str = "typo_hook"


class TypoHookBias(RelativePositions):
    def attention_kwarg(self, q, k, query_offset):  # misspelt: the core never calls it
        return {"attn_bias": torch.zeros(q.shape[1], q.shape[-2], k.shape[-2])}


class TypoHook(PositionScheme):
    config_class = TypoHookConfig

    def attention(self, head_dim, n_heads, causal):
        return TypoHookBias()


@dataclass
class TypoBuilderConfig(PositionConfig):
    scheme: str = "typo_builder"


class TypoBuilder(PositionScheme):
    config_class = TypoBuilderConfig

    def attention_module(self, head_dim, n_heads, causal):  # misnamed attention()
        return TypoHookBias()


@dataclass
class NotAModuleConfig(PositionConfig):
    scheme: str = "not_a_module"


class NotAModule(PositionScheme):
    config_class = NotAModuleConfig

    def attention(self, head_dim, n_heads, causal):
        return nn.Linear(head_dim, head_dim)


@dataclass
class DeclaredNothingConfig(PositionConfig):
    scheme: str = "declared_nothing"


class DeclaredNothing(PositionScheme):
    """Adds nothing, and says so."""

    config_class = DeclaredNothingConfig
    contributes_nothing = True


@dataclass
class ReturnsConfig(PositionConfig):
    """A scheme whose attention_kwargs returns `make(q, k)`: one broken return per test."""

    scheme: str = "returns"


class Returns(RelativePositions):
    def __init__(self, make):
        super().__init__()
        self.make = make

    def attention_kwargs(self, q, k, query_offset):
        return self.make(q, k)


class ReturnsScheme(PositionScheme):
    config_class = ReturnsConfig
    make = staticmethod(lambda q, k: {})

    def attention(self, head_dim, n_heads, causal):
        return Returns(type(self).make)


@dataclass
class BadRotateConfig(PositionConfig):
    scheme: str = "bad_rotate"


class BadRotation(RelativePositions):
    def rotate(self, q, k, offset):
        return q[..., :-1], k  # drops a feature


class BadRotate(PositionScheme):
    config_class = BadRotateConfig

    def attention(self, head_dim, n_heads, causal):
        return BadRotation()


@dataclass
class ContentOnlyConfig(PositionConfig):
    """A scheme with a content_bias hook alone, returning `make(q, k, state)`."""

    scheme: str = "content_only"


class ContentOnly(RelativePositions):
    def __init__(self, make):
        super().__init__()
        self.make = make

    def content_bias(self, q, k, x, query_offset, visible, state):
        return self.make(q, k, state)


class ContentOnlyScheme(PositionScheme):
    config_class = ContentOnlyConfig
    make = staticmethod(lambda q, k, state: (q @ k.transpose(-1, -2)).sigmoid())

    def attention(self, head_dim, n_heads, causal):
        return ContentOnly(type(self).make)


@dataclass
class BadEmbeddingConfig(PositionConfig):
    scheme: str = "bad_embedding"


class PositionsOnly(nn.Module):
    def forward(self, x, offset=0):
        return torch.zeros(x.shape[1], x.shape[2])  # the positions alone, not x + positions


class BadEmbedding(PositionScheme):
    config_class = BadEmbeddingConfig

    def embedding(self, d_model):
        return PositionsOnly()


def model_config(positions: PositionConfig, **fields) -> ModelConfig:
    fields = {"src_vocab_size": 12, "tgt_vocab_size": 12, "d_model": 16, "n_heads": 2, "d_ff": 32,
              "n_encoder_layers": 1, "n_decoder_layers": 1, **fields}
    return ModelConfig(positions=positions, **fields)


def forward(model: EncoderDecoder):
    torch.manual_seed(0)
    return model(torch.randint(4, 12, (2, 5)), torch.randint(4, 12, (2, 4)))


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


# --- a scheme that adds nothing is refused when the model is built ---------------------------------


def test_a_misspelt_attention_kwargs_is_refused_naming_the_scheme_its_class_and_the_hooks():
    with pytest.raises(ValueError) as err:
        EncoderDecoder(model_config(TypoHookConfig()))
    message = one_line(err)
    assert "position scheme 'typo_hook' (test_plugin_contracts.TypoHook)" in message
    assert "overrides none of rotate, attention_kwargs, content_bias" in message
    assert "attention_kwarg() (did you mean attention_kwargs()?)" in message


def test_a_misnamed_attention_method_is_refused_naming_the_methods_the_core_calls():
    with pytest.raises(ValueError) as err:
        DecoderLM(model_config(TypoBuilderConfig()))
    message = one_line(err)
    assert "position scheme 'typo_builder' (test_plugin_contracts.TypoBuilder) adds no positions" in message
    assert "embedding() and attention() return None" in message
    assert "attention_module() (did you mean attention()?)" in message
    assert "contributes_nothing = True" in message


def test_an_attention_module_that_is_not_relative_positions_is_refused():
    with pytest.raises(ValueError) as err:
        EncoderDecoder(model_config(NotAModuleConfig()))
    assert "attention() returned Linear; it must return a relpos_lab.api.RelativePositions" in one_line(err)


def test_a_scheme_that_declares_it_adds_nothing_builds_and_trains():
    model = EncoderDecoder(model_config(DeclaredNothingConfig()))
    forward(model).sum().backward()


def test_none_declares_that_it_adds_nothing_and_every_other_builtin_scheme_contributes():
    assert BUILTIN["none"].contributes_nothing
    assert [name for name, cls in BUILTIN.items() if cls.contributes_nothing] == ["none"]


@pytest.mark.parametrize("scheme", list(BUILTIN))
def test_every_builtin_scheme_keeps_the_contract_in_training_and_cached_decoding(scheme):
    model = EncoderDecoder(model_config(builtin_config(scheme)))
    forward(model).sum().backward()
    model.eval()
    cache = model.start_decoding(torch.randint(4, 12, (2, 5)))
    for _ in range(3):
        model.decode_step(torch.randint(4, 12, (2, 1)), cache)


def test_a_refused_scheme_is_a_one_line_config_error_naming_the_key(monkeypatch):
    real = registry.entry_points
    extra = EntryPoint("typo_hook", "test_plugin_contracts:TypoHook", registry.POSITIONS.group)
    monkeypatch.setattr(registry, "entry_points",
                        lambda group: [*real(group=group), *([extra] if group == extra.group else [])])
    from relpos_lab.config import load_config

    with pytest.raises(ConfigError) as err:
        load_config("reverse_shaw", ["model.positions.scheme=typo_hook"])
    assert "position scheme 'typo_hook' (test_plugin_contracts.TypoHook)" in one_line(err)


def test_building_the_check_does_not_change_the_models_initial_weights():
    """check_scheme builds the modules once to look at them; the random stream stays the model's."""
    torch.manual_seed(3)
    expected = torch.randn(4)
    torch.manual_seed(3)
    contract.check_scheme(BUILTIN["shaw"](builtin_config("shaw")), 16, 2)
    assert torch.equal(torch.randn(4), expected)


# --- what a hook returns is checked on its first call ----------------------------------------------


def returning(monkeypatch, make) -> EncoderDecoder:
    monkeypatch.setattr(ReturnsScheme, "make", staticmethod(make))
    return EncoderDecoder(model_config(ReturnsConfig()))


def test_an_attn_bias_of_the_wrong_shape_names_the_scheme_hook_argument_and_both_shapes(monkeypatch):
    model = returning(monkeypatch, lambda q, k: {"attn_bias": torch.zeros(q.shape[1], q.shape[-2], k.shape[-2] + 1)})
    with pytest.raises(ValueError) as err:
        forward(model)
    message = one_line(err)
    assert message == ("position scheme 'returns' (test_plugin_contracts.ReturnsScheme): Returns.attention_kwargs "
                       "returned attn_bias of shape (2, 5, 6); expected a shape broadcastable to "
                       "(B, H, Lq, Lk) = (2, 2, 5, 5)")


def test_an_unknown_keyword_is_refused_with_the_closest_valid_one(monkeypatch):
    model = returning(monkeypatch, lambda q, k: {"atn_bias": torch.zeros(q.shape[-2], k.shape[-2])})
    with pytest.raises(TypeError) as err:
        forward(model)
    message = one_line(err)
    assert "Returns.attention_kwargs returned unknown key 'atn_bias'; did you mean 'attn_bias'?" in message
    assert "relative_attention takes rel_k, rel_v, max_distance, attn_bias" in message


def test_a_keyword_the_core_passes_itself_is_refused(monkeypatch):
    model = returning(monkeypatch, lambda q, k: {"is_causal": True})
    with pytest.raises(TypeError) as err:
        forward(model)
    assert "unknown key 'is_causal'; the core sets it itself" in one_line(err)


def test_a_table_of_the_wrong_width_names_the_expected_shapes(monkeypatch):
    model = returning(monkeypatch, lambda q, k: {"rel_k": torch.zeros(5, q.shape[-1]), "max_distance": 4})
    with pytest.raises(ValueError) as err:
        forward(model)
    assert ("Returns.attention_kwargs returned rel_k of shape (5, 8); expected (9, 8) or (2, 9, 8) for "
            "max_distance=4") in one_line(err)


def test_a_hook_that_returns_no_dict_is_refused(monkeypatch):
    model = returning(monkeypatch, lambda q, k: torch.zeros(q.shape[-2], k.shape[-2]))
    with pytest.raises(TypeError) as err:
        forward(model)
    assert "Returns.attention_kwargs returned a Tensor; expected a dict of relative_attention keywords" in one_line(err)


def test_valid_keys_are_relative_attentions_own_keyword_only_parameters(monkeypatch):
    """A keyword added to relative_attention (say rel_bias, (H, 2k+1)) is valid with no change here."""
    def widened(q, k, v, *, rel_k=None, rel_v=None, max_distance=0, attn_mask=None, is_causal=False,
                query_offset=0, dropout_p=0.0, impl="auto", attn_bias=None, rel_bias=None):
        """relative_attention with one more keyword."""

    monkeypatch.setattr(contract, "relative_attention", widened)
    assert contract.scheme_keys() == ("rel_k", "rel_v", "max_distance", "attn_bias", "rel_bias")
    q = k = torch.zeros(1, 2, 3, 8)
    module = Returns(lambda q, k: {})
    contract.check_attention_kwargs("s", module, {"rel_bias": torch.zeros(2, 9), "max_distance": 4}, q, k)
    with pytest.raises(ValueError, match=r"returned rel_bias of shape \(2, 5\); expected \(2, 9\)"):
        contract.check_attention_kwargs("s", module, {"rel_bias": torch.zeros(2, 5), "max_distance": 4}, q, k)


def test_the_valid_keys_are_read_from_the_real_signature():
    parameters = inspect.signature(contract.relative_attention).parameters.values()
    keyword_only = [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]
    assert set(contract.scheme_keys()) == set(keyword_only) - set(contract.CORE_KEYS)


def test_a_rotation_that_changes_the_shape_is_refused():
    with pytest.raises(ValueError) as err:
        forward(EncoderDecoder(model_config(BadRotateConfig())))
    assert ("position scheme 'bad_rotate' (test_plugin_contracts.BadRotate): BadRotation.rotate returned q of "
            "shape (2, 2, 5, 7); expected the shape it was given, (2, 2, 5, 8)") in one_line(err)


def test_an_embedding_that_returns_the_positions_alone_is_refused():
    with pytest.raises(ValueError) as err:
        forward(EncoderDecoder(model_config(BadEmbeddingConfig())))
    assert ("PositionsOnly.forward (the embedding) returned shape (5, 16); expected x + positions, of x's shape "
            "(B, L, d_model) = (2, 5, 16)") in one_line(err)


def test_hooks_are_checked_on_their_first_call_only(monkeypatch):
    calls = []
    monkeypatch.setattr(contract, "check_attention_kwargs", lambda *args: calls.append(args))
    model = EncoderDecoder(model_config(builtin_config("shaw")))
    forward(model)
    forward(model)
    assert len(calls) == 2  # one per self-attention layer (encoder, decoder), not per call


# --- the content hook: content_bias(q, k, x, query_offset, visible, state) -----------------------


def content_only(monkeypatch, make) -> EncoderDecoder:
    monkeypatch.setattr(ContentOnlyScheme, "make", staticmethod(make))
    return EncoderDecoder(model_config(ContentOnlyConfig()))


def test_a_scheme_with_only_a_content_bias_adds_positions_and_trains_and_decodes():
    model = EncoderDecoder(model_config(ContentOnlyConfig()))
    forward(model).sum().backward()
    model.eval()
    cache = model.start_decoding(torch.randint(4, 12, (2, 5)))
    model.decode_step(torch.randint(4, 12, (2, 2)), cache)


def test_a_content_bias_of_the_wrong_shape_names_the_hook_and_both_shapes(monkeypatch):
    model = content_only(monkeypatch, lambda q, k, state: torch.zeros(q.shape[-2], k.shape[-2] + 1))
    with pytest.raises(ValueError) as err:
        forward(model)
    assert one_line(err) == ("position scheme 'content_only' (test_plugin_contracts.ContentOnlyScheme): "
                             "ContentOnly.content_bias returned a bias of shape (5, 6); expected a shape "
                             "broadcastable to (B, H, Lq, Lk) = (2, 2, 5, 5)")


def test_a_content_bias_that_returns_a_dict_is_refused(monkeypatch):
    model = content_only(monkeypatch, lambda q, k, state: {"attn_bias": torch.zeros(1)})
    with pytest.raises(TypeError) as err:
        forward(model)
    assert "ContentOnly.content_bias returned a dict; expected a float tensor broadcastable to" in one_line(err)


def test_a_key_state_with_an_entry_per_query_not_per_key_is_refused(monkeypatch):
    """What the state keeps must line up with the cached keys: appending all keys again is a bug."""
    def make(q, k, state):
        state.append(k[..., 0])
        state.append(k[..., 0])
        return torch.zeros(1)

    model = content_only(monkeypatch, make)
    with pytest.raises(ValueError) as err:
        forward(model)
    assert ("ContentOnly.content_bias left a KeyState of shape (2, 2, 10); expected one entry per key, "
            "(B, H, Lk, ...) with B = 2, Lk = 5") in one_line(err)


def test_the_key_state_travels_with_the_cache_and_beam_search_reorders_it():
    state = KeyState()
    torch.testing.assert_close(state.append(torch.tensor([[[1.0]], [[2.0]]])), torch.tensor([[[1.0]], [[2.0]]]))
    state.append(torch.tensor([[[3.0]], [[4.0]]]))
    state.reorder(torch.tensor([1, 1, 0]))
    assert state.value.tolist() == [[[2.0, 4.0]], [[2.0, 4.0]], [[1.0, 3.0]]]


# --- deliberately broken tasks ---------------------------------------------------------------------


@dataclass
class TinyConfig(TaskConfig):
    name: str = "tiny"


class TinyTask(Seq2SeqTask):
    """A task that keeps the contract; the broken ones below each break one verb."""

    config_class = TinyConfig

    def build_vocab(self):
        return Vocabulary(str(i) for i in range(4))

    def dataset(self, split):
        return [Pair(torch.tensor([4, 5, 6]), torch.tensor([6, 5, 4])) for _ in range(4)]


class BareLossTask(TinyTask):
    def loss(self, model, batch, label_smoothing):
        return super().loss(model, batch, label_smoothing).loss  # the tensor alone


class ListBatchTask(TinyTask):
    def collate(self, examples):
        return list(super().collate(examples).values())


class TextPredictionsTask(TinyTask):
    def evaluate(self, model, batch, evaluation):
        super().evaluate(model, batch, evaluation)
        return ["4 5 6"]


class DictMetricsTask(TinyTask):
    def build_evaluation(self, split):
        return {"exact_match": 0.0}


def tiny(cls: type[TinyTask]) -> tuple[TinyTask, nn.Module, dict]:
    task = cls(TinyConfig(), seed=0)
    model = task.build_model(model_config(builtin_config("shaw"), src_vocab_size=0, tgt_vocab_size=0))
    return task, model, TinyTask.collate(task, task.dataset("train"))


def test_a_loss_that_returns_a_bare_tensor_names_the_task_the_verb_and_loss_output():
    task, model, batch = tiny(BareLossTask)
    with pytest.raises(TypeError) as err:
        Checked(task, "loss")(model, batch, 0.1)
    assert one_line(err) == (
        "task 'tiny' (test_plugin_contracts.BareLossTask): BareLossTask.loss() returned a Tensor of shape (); "
        "expected a LossOutput(loss, nll_sum, n_tokens) of one-element tensors (relpos_lab.api.LossOutput, "
        "as label_smoothed_loss returns)")


def test_a_collate_that_returns_no_dict_is_refused():
    task, _, _ = tiny(ListBatchTask)
    with pytest.raises(TypeError) as err:
        Checked(task, "collate")(task.dataset("train"))
    assert "ListBatchTask.collate() returned a list; expected a Batch: a dict of str -> tensor" in one_line(err)


def test_an_evaluate_that_returns_text_is_refused():
    task, model, batch = tiny(TextPredictionsTask)
    with pytest.raises(TypeError) as err:
        Checked(task, "evaluate")(model.eval(), batch, task.build_evaluation("valid"))
    assert ("TextPredictionsTask.evaluate() returned a list; expected a Tensor of predictions (for sample_rows) "
            "or None") in one_line(err)


def test_a_build_evaluation_that_returns_a_dict_is_refused():
    task, _, _ = tiny(DictMetricsTask)
    with pytest.raises(TypeError) as err:
        check(task, "build_evaluation", task.build_evaluation("valid"))
    assert "DictMetricsTask.build_evaluation() returned a dict with keys ['exact_match']; expected an Evaluation" \
        in one_line(err)


def test_a_task_that_keeps_the_contract_passes_every_check():
    task, model, batch = tiny(TinyTask)
    assert isinstance(Checked(task, "loss")(model, batch, 0.1), LossOutput)
    assert Checked(task, "evaluate")(model.eval(), batch, task.build_evaluation("valid")).dim() == 2
    check(task, "build_model", model)
    check(task, "build_evaluation", task.build_evaluation("test"))


def test_only_the_first_call_is_checked():
    task, model, batch = tiny(TinyTask)
    loss = Checked(task, "loss")
    loss(model, batch, 0.1)
    task.loss = lambda *args: "not a loss"  # broken from now on: no longer looked at
    assert loss(model, batch, 0.1) == "not a loss"


def test_the_training_module_checks_the_tasks_loss(tmp_path):
    from omegaconf import OmegaConf

    from relpos_lab.config import load_config
    from relpos_lab.training.module import RelposModule

    cfg = load_config("reverse_shaw", ["debug"])
    task = BareLossTask(TinyConfig(), seed=0)
    cfg.model = OmegaConf.merge(cfg.model, {"src_vocab_size": 0, "tgt_vocab_size": 0})
    module = RelposModule(cfg, task)
    batch = task.collate(task.dataset("train"))
    with pytest.raises(TypeError, match=r"BareLossTask\.loss\(\) returned a Tensor"):
        module.training_step(batch, 0)
