"""README's "The models from Python" block runs as written (its asserts included)."""
import re
from pathlib import Path

import torch


def test_the_readmes_python_api_example_runs():
    text = (Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(import torch\nfrom relpos_lab.api import DecoderLM.*?)```", text, re.S).group(1)
    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(block, "README.md (The models from Python)", "exec"), scope)
    assert scope["logits"].shape == (2, 7, 100) and scope["new"].shape == (2, 20)
    assert scope["new_logits"].shape == (2, 20, 100) and scope["out"].shape[0] == 2
