"""The package's architecture, enforced: each subpackage imports only the ones below it, lazily
inside functions too, the import graph has no circle, the model core imports only torch, and
reading a config never loads Lightning."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import relpos_lab

PACKAGE = Path(relpos_lab.__file__).parent
REPO = PACKAGE.parent
# Bottom to top. A module may import its own layer and the layers below it, never one above.
LAYERS = ("core", "api", "config", "records", "training", "face", "launch", "analysis", "cli")
# relpos_lab/attention.py re-exports the core's attention under the path docs/design.md promises.
TOP_LEVEL = {"attention": "core", "cli": "cli", "terminal": "cli", "__main__": "cli", "__init__": "core"}
FACE = {"relpos_lab.api"}
"""The face of the api: `relpos_lab.api` (api/__init__.py), what plugins and scripts import. It
re-exports `load_model` and `LoadedModel` from the training layer (training/inference.py), so it
sits above training: the layers below import the api's modules (`relpos_lab.api.errors`, ...),
never the face, and no api module but the face imports anything above the api. Importing any api
module runs the face's module body, which imports only core and api modules (`load_model` loads
when asked for): test_the_api_face_imports_nothing_until_a_name_is_asked_for."""


def layer_of(module: str) -> str:
    parts = module.split(".")
    assert parts[0] == "relpos_lab", module
    if module in FACE:
        return "face"
    name = parts[1] if len(parts) > 1 else "__init__"
    return name if name in LAYERS[:-1] else TOP_LEVEL[name]


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)] = path
    return found


def imports(path: Path, eager: bool = False) -> set[str]:
    """Every module a file imports, lazily inside functions too (eager: only those importing the
    file runs, outside function bodies); relative imports resolved. `from package import module`
    imports the module, as `import package.module` does; a name that is not a module, the package."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = set()
    tree = ast.parse(path.read_text())
    known = modules()
    for node in (_outside_functions(tree) if eager else ast.walk(tree)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known.keys()
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(base)
    return found


def _outside_functions(node: ast.AST):
    """`node` and every node under it but those inside a function's body or ``if TYPE_CHECKING:``
    (what only type checkers run)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
            yield from (n for other in child.orelse for n in _outside_functions(other))
        elif not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _outside_functions(child)


def graph() -> dict[str, set[str]]:
    """The import graph of relpos_lab: {module: the package's modules it imports}, lazy imports too."""
    known = modules()
    return {module: {t for t in imports(path) if t in known and t != module} for module, path in known.items()}


def test_every_module_belongs_to_a_layer():
    for module in modules():
        assert layer_of(module) in LAYERS, f"{module} is in no layer: add it to LAYERS or TOP_LEVEL"


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for module, path in modules().items():
        rank = LAYERS.index(layer_of(module))
        for target in imports(path):
            if target.split(".")[0] == "relpos_lab" and LAYERS.index(layer_of(target)) > rank:
                upward.append(f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})")
    assert not upward, "imports point upwards:\n" + "\n".join(upward)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of the graph `edges`, one per strongly connected component of more than one
    module (Tarjan's algorithm), each as the component's modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_circle():
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_finder_finds_circles():
    """test_the_import_graph_has_no_circle would pass vacuously if `circles` missed one."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["a", "b"], ["c", "d"]]
    assert circles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_api_face_imports_nothing_until_a_name_is_asked_for():
    """Every api module import runs api/__init__.py (the CLI imports api.errors before it knows
    what it will run), so the face imports its names in `__getattr__`, on request, from the homes
    its table names: the ones its type-checking imports name too."""
    from relpos_lab import api

    face = modules()["relpos_lab.api"]
    assert not {t for t in imports(face, eager=True) if t.startswith("relpos_lab.")}
    assert set(api.HOMES) == {t for t in imports(face) if t.startswith("relpos_lab.")}
    assert sorted(api.HOME) == sorted(api.__all__)


API_ONLY = r"""
import sys
import relpos_lab.api
from relpos_lab.api import DecoderCache, PrefixLM, Seq2SeqTask, registry
def above():
    return sorted(m for m in sys.modules if m.startswith(("relpos_lab.config", "relpos_lab.records",
        "relpos_lab.training", "relpos_lab.launch", "relpos_lab.analysis", "relpos_lab.cli", "pytorch_lightning"))
        or m == "lightning" or m.startswith("lightning."))
print("LOADED", above())
from relpos_lab.api import LoadedModel, load_model
from relpos_lab.training import inference
assert load_model is inference.load_model and LoadedModel is inference.LoadedModel
assert "relpos_lab.training.inference" in above()
"""


def test_importing_the_api_loads_no_layer_above_it_nor_lightning():
    """`import relpos_lab.api` and its names cost no Lightning import; `load_model` loads the
    training layer when asked for, and is the loader `translate` uses."""
    result = subprocess.run([sys.executable, "-c", API_ONLY], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "LOADED []" in result.stdout, result.stdout


TRITON_MODULES = ("relpos_lab.core.attention.fused", "relpos_lab.core.attention.fused_kernels",
                  "relpos_lab.core.attention.fused_tuning", "relpos_lab.core.attention.compiled")
"""The fused kernel: fused.py and fused_tuning.py import triton and the kernels module only where
triton is installed, and compiled.py (the autotuner's spill check) imports triton only inside its
functions."""


def test_the_core_imports_only_torch_and_the_standard_library():
    foreign = []
    for module, path in modules().items():
        if layer_of(module) != "core":
            continue
        for target in imports(path):
            top = target.split(".")[0]
            if top in sys.stdlib_module_names or top == "torch" or target == "__future__":
                continue
            if top == "relpos_lab" and layer_of(target) == "core":
                continue
            if top == "triton" and module in TRITON_MODULES:  # ships with CUDA torch
                continue
            foreign.append(f"{module} imports {target}")
    assert not foreign, "the core must stay torch-only:\n" + "\n".join(foreign)


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """The layer test would pass vacuously if `imports` missed lazy or relative imports."""
    core_module = PACKAGE / "core" / "positions" / "rotary.py"
    found = imports(core_module)
    assert "torch" in found
    # `from relpos_lab.api import registry` imports that module; `from relpos_lab.api import X`, the face
    assert {"relpos_lab.api.registry", "relpos_lab.api"} & imports(PACKAGE / "config" / "help.py") == {
        "relpos_lab.api.registry"}
    face_and_module = imports(REPO / "tests" / "test_encoder_only.py")  # `import EncoderOnly, ..., registry`
    assert {"relpos_lab.api.registry", "relpos_lab.api"} <= face_and_module
    probe = tmp_path / "relpos_lab" / "core" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("import torch\ndef f():\n    from ..training import module\n    import lightning\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "relpos_lab")
    assert {"relpos_lab.training", "lightning"} <= imports(probe)
    assert imports(probe, eager=True) == {"torch"}  # what importing it runs: not the function's imports


CONFIG_ONLY = r"""
import sys
from pathlib import Path
from relpos_lab import cli
from relpos_lab.api.errors import ConfigError
from relpos_lab.config import load_config
from relpos_lab.launch.sweep import load_sweep

root = Path(sys.argv[1])
checked = 0
for path in sorted(root.rglob("*.yaml")):
    group = path.relative_to(root).parts[0]
    if group == "sweep":
        continue  # a sweep file is not an experiment; its points are the experiments below
    load_config(path, partial=group != "experiment")
    if group == "experiment":  # with the groups an experiment is commonly run with
        load_config(path.stem, ["debug", "model=shaw_small", "trainer=cpu"])
    checked += 1
assert checked > 10, checked
load_sweep("shaw2018_abs_vs_rel")  # one sweep: the loader is the same for all, and each point costs ~0.1 s
assert cli.main(["config", str(root / "experiment" / "reverse_shaw.yaml")]) == 0
try:
    load_config(root / "experiment" / "reverse_shaw.yaml", ["optim.lrr=1"])
except ConfigError as err:
    assert "did you mean 'optim.lr'" in str(err), err
else:
    raise AssertionError("an unknown key was accepted")
assert cli.main(["config", str(root / "experiment" / "reverse_shaw.yaml"), "model.d_modle=8"]) == 2
loaded = sorted(m for m in sys.modules if m == "lightning" or m.startswith(("lightning.", "pytorch_lightning")))
# torch.compile's machinery (dynamo: about 2 s of imports) waits until something compiles
loaded += sorted(m for m in sys.modules if m == "torch._dynamo")
print("LOADED", loaded)
assert not loaded, loaded
"""


def test_reading_and_checking_every_shipped_config_never_imports_lightning():
    """`relpos-lab config`, every shipped config, a sweep and config errors answer without Lightning or
    torch.compile's dynamo."""
    result = subprocess.run([sys.executable, "-c", CONFIG_ONLY, str(REPO / "configs")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "LOADED []" in result.stdout


HELP_ONLY = r"""
import contextlib, io, sys
from relpos_lab import cli
for argv in (["--help"], ["train", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        cli.main(argv)
print("LOADED", sorted(m for m in sys.modules if m in ("torch", "torchmetrics", "lightning", "omegaconf")))
"""


def test_help_imports_neither_torch_nor_the_config_layer():
    """`relpos-lab --help` answers at once (0.07 s, against 2.2 s when the api face imported torch)."""
    result = subprocess.run([sys.executable, "-c", HELP_ONLY], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "LOADED []" in result.stdout, result.stdout


LISTED_INITS = ("attention", "positions", "cli")
"""The packages whose __init__.py is a module of its own (the op's dispatch, the schemes by name, the
program), listed in the tree; the other folders' __init__.py are not."""


def test_the_contributing_layout_lists_every_module_once():
    """CONTRIBUTING.md's tree (one line per module, folders as `name/`) is the package's files, exactly."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    block = text[text.index("## Layout"):]
    block = block[block.index("```\n") + 4:]
    block = block[:block.index("```")]
    listed, folders = [], []
    for line in block.splitlines():
        if not line.strip() or line.startswith(" " * 30):  # blank, or a description's continuation
            continue
        indent = (len(line) - len(line.lstrip())) // 2
        name = line.split()[0]
        folders = folders[:indent]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        else:
            listed.append("/".join([*folders, name]))
    files = sorted(
        str(p.relative_to(REPO)) for top in ("relpos_lab", "tasks") for p in (REPO / top).rglob("*")
        if p.suffix in (".py", ".sbatch") and (p.name != "__init__.py" or p.parent.name in LISTED_INITS)
        and "__pycache__" not in p.parts
    )
    assert len(listed) == len(set(listed)), f"listed twice: {sorted({x for x in listed if listed.count(x) > 1})}"
    assert sorted(listed) == files, (f"in CONTRIBUTING.md, not in the tree: {sorted(set(listed) - set(files))}; "
                                     f"in the tree, not in CONTRIBUTING.md: {sorted(set(files) - set(listed))}")
