"""relpos_lab.api is the stable surface for plugin authors, and a name that moves keeps working for
a release with a DeprecationWarning naming the new one, then goes, as CHANGELOG.md says.

pyproject's filterwarnings ignores DeprecationWarning globally, so each test here records the
warnings itself (pytest.warns / warnings.catch_warnings).
"""
from __future__ import annotations

import ast
import importlib.util
import json
import pickle
import re
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import relpos_lab.api

import docs_text

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def readme_imports() -> dict[str, set[str]]:
    """Every `from relpos_lab... import name` in the python blocks of README and the guides (docs/):
    {name: modules it comes from}."""
    found: dict[str, set[str]] = {}
    for block in docs_text.blocks("python"):
        for node in ast.walk(ast.parse(block.text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "relpos_lab":
                for alias in node.names:
                    found.setdefault(alias.name, set()).add(node.module)
    return found


def test_readme_examples_import_from_relpos_lab():
    """The parse below finds what it should (else the next test would pass on nothing)."""
    names = readme_imports()
    assert {"Seq2SeqTask", "TaskConfig", "PositionScheme", "RelativePositions", "relative_attention"} <= set(names)


def test_every_name_readme_imports_from_relpos_lab_is_in_relpos_lab_api():
    missing = [f"{name} (the docs import it from {', '.join(sorted(modules))})"
               for name, modules in readme_imports().items() if not hasattr(relpos_lab.api, name)]
    assert not missing, "not exported by relpos_lab.api: " + "; ".join(missing)


def test_relpos_lab_api_exports_exactly_its_all():
    for name in relpos_lab.api.__all__:
        assert getattr(relpos_lab.api, name) is not None, name
    assert sorted(relpos_lab.api.__all__) == sorted(set(relpos_lab.api.__all__))


# --- the names 0.2.0 renamed: gone in 0.3.0, as its CHANGELOG said ----------------------------------

REMOVED = {
    "relpos_lab.core.positions": ("SinusoidalPositions", "LearnedPositions", "NoPositions", "NoPositionsConfig",
                                  "AbacusPositions", "CouplingPositions", "CouplingEmbedding", "PolarPositions",
                                  "scheme_of"),
    "relpos_lab.core.positions.rotary": ("rotate_half",),
    "relpos_lab.core.attention.masks": ("relative_positions", "reach"),
    "relpos_lab.training.inference": ("load_for_inference",),
    "relpos_lab.api.task.Task": ("decode", "decode_output"),
    "relpos_lab.core.transformer.MultiHeadAttention": ("positions", "scheme", "impl"),
    "relpos_lab.core.embedding.Embedding": ("positions", "scheme"),
}


@pytest.mark.parametrize("owner, old", [(o, n) for o, names in REMOVED.items() for n in names])
def test_a_name_0_2_0_deprecated_is_gone_and_the_changelog_says_so(owner, old):
    if owner.rsplit(".", 1)[-1][0].isupper():  # a class's attribute
        module_name, cls = owner.rsplit(".", 1)
        holder = getattr(importlib.import_module(module_name), cls)
    else:
        holder = importlib.import_module(owner)
    assert not hasattr(holder, old), f"{owner}.{old} is still there"
    removed = (REPO / "CHANGELOG.md").read_text().split("## 0.2.0")[0]
    assert re.search(rf"`[\w.]*\b{old}\b", removed), f"CHANGELOG.md's 0.3.0 section does not name {old}"


def tiny_model(scheme: str):
    from relpos_lab.api.testing import tiny_model_config
    from relpos_lab.core.positions import builtin_config
    from relpos_lab.core.transformer import EncoderDecoder
    return EncoderDecoder(tiny_model_config(builtin_config(scheme))).double().eval()


def test_a_decoder_caches_old_positions_keyword_and_attribute_warn_and_reach_positions():
    """DecoderCache's drawn positions are `positions`, as relative_attention's keyword says; the
    old name, `input_pos`, still works for a release, as a keyword and as an attribute."""
    import torch

    from relpos_lab.api import DecoderCache

    drawn = torch.arange(4)
    owner = "relpos_lab.core.cache.DecoderCache"
    with pytest.warns(DeprecationWarning, match=rf"^{re.escape(owner)}\.input_pos is deprecated: it is "
                                                rf"{re.escape(owner)}\.positions now"):
        cache = DecoderCache(1, input_pos=drawn)
    assert cache.positions is drawn
    with pytest.warns(DeprecationWarning, match=r"input_pos is deprecated"):
        assert cache.input_pos is drawn
    assert DecoderCache(1, None, None, drawn).positions is drawn
    assert "`DecoderCache.input_pos`" in (REPO / "CHANGELOG.md").read_text()

@pytest.mark.parametrize("scheme, old_key", [("shaw", "encoder.layers.0.self_attn.inner.positions.rel_k"),
                                             ("learned", "decoder.embed.positions.embedding.weight")])
def test_a_state_dict_saved_before_the_renames_loads_strictly_with_the_same_outputs(scheme, old_key):
    """Checkpoints from before MultiHeadAttention.relative and Embedding.absolute (0.2.0) name the
    scheme's modules `positions`: a load_state_dict pre-hook reads their keys under the new names.
    A checkpoint is data, not API: this stays when the renamed attributes have gone."""
    torch.manual_seed(0)
    saved = tiny_model(scheme)

    def before_the_rename(key: str) -> str:
        return re.sub(r"(^|\.)(relative|absolute)(\.|$)", r"\1positions\3", key)

    state = saved.state_dict()
    old = type(state)((before_the_rename(k), v) for k, v in state.items())
    old._metadata = type(state._metadata)((before_the_rename(k), v) for k, v in state._metadata.items())
    assert old_key in old and not any(".relative." in k or ".absolute." in k for k in old)
    src, tgt_in = torch.randint(1, 12, (2, 7)), torch.randint(1, 12, (2, 5))
    want = saved(src, tgt_in)
    torch.manual_seed(1)
    fresh = pickle.loads(pickle.dumps(tiny_model(scheme)))  # the hooks pickle with the model
    assert not torch.equal(fresh(src, tgt_in), want)
    fresh.load_state_dict(old)  # strict
    assert torch.equal(fresh(src, tgt_in), want)
    assert old_key in old  # the caller's state dict keeps its keys


REMOVED_MODULES = ("relpos_lab.task", "relpos_lab.transformer", "relpos_lab.positions", "relpos_lab.api.checkpoint")
"""The pre-0.2 paths, deprecated in 0.2.0 and removed in 0.3.0."""


def test_the_version_is_the_changelogs_latest_release():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(r"^## (\S+)", changelog, re.M).group(1) == version == "0.3.1"
    assert "CHANGELOG.md" in README.read_text()


@pytest.mark.parametrize("module", REMOVED_MODULES)
def test_a_removed_path_is_gone_and_the_changelog_says_how_to_migrate(module):
    assert importlib.util.find_spec(module) is None
    assert f"from {module} import" in (REPO / "CHANGELOG.md").read_text(), f"CHANGELOG.md: how to migrate from {module}"


# --- what a script needs: a trained checkpoint's model, config and task; the decoding cache ---------

SCRIPT_NAMES = {"DecoderCache": "relpos_lab.core.cache", "PrefixLM": "relpos_lab.core.prefix_lm",
                "LoadedModel": "relpos_lab.training.inference", "load_model": "relpos_lab.training.inference"}


@pytest.mark.parametrize("name", sorted(SCRIPT_NAMES))
def test_relpos_lab_api_exports_what_a_script_needs(name):
    assert name in relpos_lab.api.__all__ and name in dir(relpos_lab.api)
    assert getattr(relpos_lab.api, name) is getattr(sys.modules[SCRIPT_NAMES[name]], name)


def test_a_misspelt_name_of_the_api_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="has no attribute 'load_modle'"):
        relpos_lab.api.load_modle  # noqa: B018


def test_the_decoder_cache_is_still_importable_from_the_transformer_module():
    """core/cache.py holds the KV cache since 0.2.0; scripts and plugins that import it from
    core.transformer get the very same class."""
    import relpos_lab.core.transformer

    assert relpos_lab.core.transformer.DecoderCache is relpos_lab.api.DecoderCache


def test_the_exported_decoder_cache_reorders_its_rows():
    """`DecoderCache.reorder` keeps batch rows by index, repeated or reordered (what beam search does)."""
    from relpos_lab.api import DecoderCache, PrefixLM

    torch.manual_seed(0)
    model = PrefixLM(relpos_lab.api.ModelConfig(src_vocab_size=12, tgt_vocab_size=12, d_model=16, n_heads=2, d_ff=32,
                                                n_decoder_layers=2, architecture="decoder_only")).eval()
    src, tokens = torch.randint(4, 12, (2, 5)), torch.randint(4, 12, (3, 1))
    with torch.no_grad():
        cache = model.start_decoding(src)
        assert isinstance(cache, DecoderCache)
        cache.reorder(torch.tensor([1, 1, 0]))
        reordered = model.decode_step(tokens, cache)
        alone = [model.decode_step(tokens[i:i + 1], model.start_decoding(src[row:row + 1]))
                 for i, row in enumerate((1, 1, 0))]
    assert torch.allclose(reordered, torch.cat(alone), atol=1e-5)


def test_load_model_gives_the_model_the_run_evaluated_with_its_config_and_task(tiny_reverse_run):
    """A tiny run trained by the CLI (conftest.tiny_reverse_run), loaded again: its weights, in eval
    mode, reproduce the run's own test numbers (results.json) on the checkpoint it evaluated."""
    from omegaconf import OmegaConf

    from relpos_lab.api import EncoderDecoder, LoadedModel, PrefixLM, load_model

    results = json.loads((tiny_reverse_run / "results.json").read_text())
    checkpoint = tiny_reverse_run / results["checkpoint"]
    loaded = load_model(checkpoint)
    assert isinstance(loaded, LoadedModel)
    model, config, task = loaded
    assert (model, config, task) == (loaded.model, loaded.config, loaded.task)

    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert OmegaConf.to_container(config, resolve=True) == saved["hyper_parameters"]["config"]
    decoder_only = config.model.architecture == "decoder_only"
    assert type(model) is (PrefixLM if decoder_only else EncoderDecoder)
    assert task.cfg.name == "reverse" and task.cfg == OmegaConf.to_object(config.task)

    assert not any(m.training for m in model.modules())
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    weights = {k.removeprefix("model."): v for k, v in saved["state_dict"].items() if k.startswith("model.")}
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())

    evaluation = task.build_evaluation("test")
    with torch.no_grad():
        task.evaluate(model, task.collate(list(task.dataset("test"))), evaluation)
    evaluated = evaluation.compute()
    assert {"loss", "exact_match", "token_accuracy"} <= evaluated.metrics.keys()
    for name, value in evaluated.metrics.items():
        assert value == pytest.approx(results["metrics"][f"test/{name}"], abs=1e-5), name
    assert {str(n): row for n, row in evaluated.by_length.items()} == results["by_length"]["test"]


def test_load_model_applies_overrides_and_refuses_one_that_changes_the_model_in_one_line(tiny_reverse_run):
    from relpos_lab.api import UserError, load_model

    checkpoint = tiny_reverse_run / "checkpoints" / "last.ckpt"
    model, config, task = load_model(checkpoint, ["task.decoding.beam_size=3", "task.test_lengths=[7,8]"])
    assert config.task.decoding.beam_size == task.cfg.decoding.beam_size == 3
    assert list(task.cfg.test_lengths) == [7, 8] and not model.training
    with pytest.raises(UserError) as caught:
        load_model(checkpoint, ["model.d_model=32"])
    message = str(caught.value)
    assert "\n" not in message and "does not fit the model this config builds" in message
    assert "model.d_model 16 -> 32" in message and "Drop the overrides that change the model's shape" in message


def test_load_model_of_a_missing_or_foreign_file_is_one_line(tmp_path):
    from relpos_lab.api import UserError, load_model

    def message(path) -> str:
        with pytest.raises(UserError) as caught:
            load_model(path)
        assert "\n" not in str(caught.value)
        return str(caught.value)

    assert message(tmp_path / "nope.ckpt") == f"checkpoint not found: {tmp_path / 'nope.ckpt'}"
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    assert "notes.txt is not a checkpoint torch can read (torch.load: " in message(tmp_path / "notes.txt")
    torch.save({"state_dict": {}}, tmp_path / "foreign.ckpt")
    assert message(tmp_path / "foreign.ckpt").endswith(
        "foreign.ckpt: not a relpos-lab checkpoint (no config in its hyperparameters)")
