"""The guides' Python blocks run as written (their asserts included): "The models from Python", and
"A trained checkpoint from Python" on a real checkpoint of each architecture (docs/models.md)."""
import torch

from relpos_lab.api import EncoderDecoder, PrefixLM

import docs_text


def test_the_readmes_python_api_example_runs():
    block = docs_text.block("import torch\nfrom relpos_lab.api import DecoderLM")
    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(block.text, f"{block.page} (The models from Python)", "exec"), scope)
    assert scope["logits"].shape == (2, 7, 100) and scope["new"].shape == (2, 20)
    assert scope["new_logits"].shape == (2, 20, 100) and scope["out"].shape[0] == 2


def test_the_readmes_checkpoint_example_scores_with_the_cache(tiny_reverse_run, capsys):
    """The block with the guide's checkpoint path replaced by a tiny run's (see conftest.tiny_reverse_run)."""
    found = docs_text.block("import torch\nfrom relpos_lab.api import DecoderCache, load_model\n")
    block = found.text
    shown = "runs/reverse_shaw/reverse-shaw-k16-<hash>/checkpoints/last.ckpt"
    assert block.count(shown) == 1
    block = block.replace(shown, str(tiny_reverse_run / "checkpoints" / "last.ckpt"))
    scope: dict = {}
    exec(compile(block, f"{found.page} (A trained checkpoint from Python)", "exec"), scope)
    decoder_only = scope["config"].model.architecture == "decoder_only"
    assert type(scope["model"]) is (PrefixLM if decoder_only else EncoderDecoder)
    assert scope["scores"].shape == (2,) and bool((scope["scores"] < 0).all())
    assert capsys.readouterr().out.startswith(f"{type(scope['model']).__name__} shaw [")


def test_the_guides_compiling_example_keeps_the_models_weights(tmp_path, monkeypatch):
    """Both ways of compiling from Python (docs/models.md, "Compiling"); nothing is called, so nothing compiles."""
    monkeypatch.chdir(tmp_path)
    block = docs_text.block("import torch\nfrom relpos_lab.api import EncoderDecoder, ModelConfig, builtin_config\n")
    scope: dict = {}
    exec(compile(block.text, f"{block.page} (Compiling)", "exec"), scope)
    reloaded = EncoderDecoder(scope["cfg"])
    reloaded.load_state_dict(torch.load(tmp_path / "model.pt"))
    assert all(k.startswith("_orig_mod.") for k in scope["compiled"].state_dict())
