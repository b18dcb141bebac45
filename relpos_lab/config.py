"""Experiment configs: dataclass schemas, and loading YAML + overrides into one validated config.

An experiment is a YAML file laid over the schema defaults below. A file may `extends:` other
files (a path or a list of paths, relative to the file), which are laid down first; then come the
command line's ``key=value`` overrides (OmegaConf dot-list syntax). The ``task`` section is checked
against the chosen task's own config dataclass, found through the registry, so a plugin's options
are validated exactly like the built-in ones.

Every mistake becomes one `ConfigError` line naming the key, where it was set (file or command
line) and what would have been valid: an unknown key (with the closest valid key), a value of the
wrong type, a value outside its choices, a missing required value, or a model shape the core
rejects. The CLI prints that line and exits with status 2.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from . import registry
from .errors import ConfigError, UserError, did_you_mean, shown_path
from .positions import SCHEMES
from .tracking import WANDB_MODES, LoggingConfig
from .transformer import MODEL_IMPLS, ModelConfig

SCHEDULERS = ("inverse_sqrt", "cosine", "constant")
PRECISIONS = ("32", "bf16-mixed", "16-mixed")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
COMMAND_LINE = "command line"


@dataclass
class DataConfig:
    batch_size: int = 64
    """examples per device and step (global batch = × devices × nodes)"""
    eval_batch_size: int = 256
    """examples per evaluation batch (per device)"""
    num_workers: int = 0
    """DataLoader worker processes; 0 loads in the training process"""

    def validate(self) -> None:
        _at_least(self, "data", batch_size=1, eval_batch_size=1, num_workers=0)


@dataclass
class OptimConfig:
    """Adam as in the Transformer paper, with a warm-up then inverse-sqrt or cosine decay."""

    lr: float = 1e-3
    """peak learning rate, reached at the end of warm-up"""
    betas: tuple[float, float] = (0.9, 0.98)
    """Adam's β1, β2"""
    eps: float = 1e-9
    """Adam's ε"""
    weight_decay: float = 0.0
    """decoupled weight decay (AdamW); 0: plain Adam"""
    scheduler: str = "inverse_sqrt"
    """inverse_sqrt | cosine | constant"""
    warmup_steps: int = 4000
    """steps of linear warm-up to lr"""
    min_lr_ratio: float = 0.0
    """cosine: final learning rate as a fraction of lr"""
    label_smoothing: float = 0.1
    """uniform label smoothing of the training loss"""

    def validate(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optim.lr={self.lr} must be > 0")
        _at_least(self, "optim", warmup_steps=0)
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"optim.label_smoothing={self.label_smoothing} must be in [0, 1)")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")


@dataclass
class TrainerConfig:
    """Lightning Trainer settings. devices × num_nodes is the world size, here and nowhere else
    (a SLURM launcher derives --ntasks-per-node and --nodes from these two)."""

    accelerator: str = "auto"
    """auto | cpu | gpu | cuda | mps"""
    devices: int = 1
    """processes (GPUs) per node"""
    num_nodes: int = 1
    """nodes; devices × num_nodes is the world size"""
    strategy: str = "auto"
    """Lightning strategy name, e.g. ddp"""
    precision: str = "32"
    """32 | bf16-mixed | 16-mixed (GPU only)"""
    max_steps: int = 10000
    """optimizer steps to train"""
    val_every_n_steps: int = 1000
    """training batches between validations (across epochs)"""
    checkpoint_every_n_steps: int = 0
    """refresh last.ckpt every N steps; 0: at each validation"""
    log_every_n_steps: int = 50
    """training steps between logged metrics"""
    gradient_clip_val: float = 0.0
    """clip the global gradient norm; 0: off"""
    accumulate_grad_batches: int = 1
    """batches per optimizer step"""
    num_sanity_val_steps: int = 2
    """validation batches run before training starts (catches evaluation bugs early)"""
    deterministic: bool = False
    """torch's deterministic algorithms (slower)"""
    enable_progress_bar: bool = True
    """rich progress bar on the console"""
    enable_model_summary: bool = True
    """print the model's layers and parameter counts at the start"""

    def validate(self) -> None:
        _at_least(self, "trainer", devices=1, num_nodes=1, max_steps=1, val_every_n_steps=1,
                  checkpoint_every_n_steps=0, log_every_n_steps=1, accumulate_grad_batches=1,
                  num_sanity_val_steps=0)
        if self.gradient_clip_val < 0:
            raise ValueError(f"trainer.gradient_clip_val={self.gradient_clip_val} must be >= 0")


@dataclass
class ClusterConfig:
    """Where a SLURM job runs (`relpos-lab submit`, `sweep --slurm`; see slurm.py).

    The world size is not here: --nodes is trainer.num_nodes, --ntasks-per-node (and
    --gpus-per-node on GPUs) is trainer.devices, so the job and Lightning cannot disagree.
    """

    partition: str | None = None
    """sbatch --partition"""
    account: str | None = None
    """sbatch --account"""
    qos: str | None = None
    """sbatch --qos"""
    constraint: str | None = None
    """sbatch --constraint (node features)"""
    time: str = "04:00:00"
    """sbatch --time, the job's time limit; the run checkpoints and requeues before it"""
    mem: str | None = None
    """per node, e.g. 64G"""
    cpus_per_task: int = 4
    """per process: data loading workers + the process itself"""
    extra_sbatch: list[str] = field(default_factory=list)
    """further "#SBATCH" options, e.g. --gres=..."""
    setup: list[str] | None = None
    """shell lines before the run (module load, conda activate); None: activate the virtual
    environment relpos-lab was submitted from"""
    signal_seconds: int = 90
    """SIGUSR1 this long before the time limit: checkpoint, then requeue"""
    array_parallelism: int = 0
    """at most this many array tasks at once (the % throttle); 0: no limit"""

    def validate(self) -> None:
        _at_least(self, "cluster", cpus_per_task=1, array_parallelism=0, signal_seconds=1)


@dataclass
class ExperimentConfig:
    name: str = MISSING
    """experiment name; defaults to the config file's stem"""
    seed: int = 0
    """seeds model initialisation, data order and the synthetic tasks' data"""
    resume: bool = False
    """continue from <run dir>/checkpoints/last.ckpt"""
    task: Any = None
    """the task and its options: validated against the chosen task's config_class (see load_config)"""
    model: ModelConfig = field(default_factory=ModelConfig)
    """the Transformer and its position scheme"""
    data: DataConfig = field(default_factory=DataConfig)
    """batching and data loading"""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """optimizer and learning-rate schedule"""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """the Lightning Trainer: hardware, precision, steps"""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """run directories and W&B"""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """SLURM settings for submit and sweep --slurm"""


# Keys whose value must be one of a few strings (checked with a "did you mean").
CHOICES: dict[str, tuple[str, ...]] = {
    "optim.scheduler": SCHEDULERS,
    "trainer.precision": PRECISIONS,
    "trainer.accelerator": ACCELERATORS,
    "model.positions.scheme": SCHEMES,
    "model.attention_impl": MODEL_IMPLS,
    "logging.wandb.mode": WANDB_MODES,
}

Source = tuple[str, DictConfig]  # (label for messages: a file path or "command line", content)


def load_config(path: str | Path, overrides: list[str] = (), *, partial: bool = False) -> DictConfig:
    """The experiment at `path` (with what it extends), then `overrides`, validated.

    partial=True checks a shared piece (configs/model/*.yaml, ...) that is not a whole
    experiment: a missing task and missing values are then allowed.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    sources = read_with_extends(path) + [parse_overrides(overrides)]
    return compose(sources, default_name=path.stem, partial=partial)


def config_from_container(container: dict, label: str, overrides: list[str] = ()) -> DictConfig:
    """Validate a config stored elsewhere (a checkpoint's), with command-line overrides on top."""
    sources = [(label, OmegaConf.create(container)), parse_overrides(overrides)]
    return compose(sources, default_name=str(container.get("name") or "experiment"))


def read_with_extends(path: Path, _seen: tuple[Path, ...] = ()) -> list[Source]:
    """The file and the files it extends, in merge order (bases first)."""
    path = path.resolve()
    label = shown_path(path)
    if path in _seen:
        chain = " -> ".join(shown_path(p) for p in (*_seen, path))
        raise ConfigError(f"{label}: circular extends ({chain})")
    if not path.is_file():
        raise ConfigError(f"config file not found: {label}" + (f" (extended by {shown_path(_seen[-1])})" if _seen else ""))
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{label}:{where} is not valid YAML ({getattr(err, 'problem', err)})") from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{label}: must hold a mapping of config sections, not a {type(raw).__name__}")
    bases = raw.pop("extends", None) or []
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{label}: extends must be a path or a list of paths, got {bases!r}")
    sources: list[Source] = []
    for base in bases:
        sources += read_with_extends(path.parent / base, (*_seen, path))
    try:
        content = OmegaConf.create(raw)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{label}: {_first_line(err)}") from None
    return sources + [(label, content)]


def parse_overrides(overrides: list[str]) -> Source:
    """`key=value` strings as one source; the value is parsed as YAML (`[1, 8]`, `true`, `1e-3`)."""
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" not in item or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key):
            raise ConfigError(f"{COMMAND_LINE}: override {item!r} is not of the form key=value (e.g. optim.lr=3e-4)")
    try:
        return COMMAND_LINE, OmegaConf.from_dotlist(list(overrides))
    except (OmegaConfBaseException, yaml.YAMLError) as err:
        raise ConfigError(f"{COMMAND_LINE}: {_first_line(err)}") from None


def compose(sources: list[Source], *, default_name: str, partial: bool = False) -> DictConfig:
    """Merge `sources` in order over the schema and validate the result (see module docstring)."""
    provenance = _provenance(sources)
    schema = OmegaConf.structured(ExperimentConfig)
    task_cls = _task_class(sources, provenance, partial)
    if task_cls is not None:
        schema.task = OmegaConf.structured(task_cls.config_class)
    cfg = schema
    for label, content in sources:
        _check_sections_are_mappings(label, content, schema)
        try:
            cfg = OmegaConf.merge(cfg, content)
        except OmegaConfBaseException as err:
            raise ConfigError(_merge_error(label, err, schema)) from None
    if OmegaConf.is_missing(cfg, "name"):
        cfg.name = default_name
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", "")
        raise ConfigError(f"{provenance.get(key, 'config')}: cannot resolve '{key}': {_first_line(err)}") from None
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing and not partial:
        files = [label for label, _ in sources if label != COMMAND_LINE]
        where = f"in {files[-1]} " if files else ""
        raise ConfigError(f"missing required value '{missing[0]}': set it {where}or pass {missing[0]}=... on the command line")
    _check_choices(cfg, provenance)
    sections = ["model", "data", "optim", "trainer", "cluster"] + (["task"] if task_cls is not None else [])
    _check_sections(cfg, provenance, sections)
    return cfg


def _check_sections_are_mappings(label: str, content: DictConfig, schema: DictConfig) -> None:
    """`optim: 3` or `task: reverse` would otherwise fail deep inside the merge without a key."""
    for key, value in OmegaConf.to_container(content, resolve=False).items():
        section = key == "task" or isinstance(schema.get(key), DictConfig)
        if section and value is not None and not isinstance(value, dict):
            example = "task: {name: reverse}" if key == "task" else f"{key}: {{...}}"
            raise ConfigError(f"{label}: '{key}' must be a mapping of settings, e.g. {example}")


def _task_class(sources: list[Source], provenance: dict[str, str], partial: bool):
    try:
        raw = OmegaConf.merge(OmegaConf.create(), *(content for _, content in sources))
    except OmegaConfBaseException as err:  # e.g. a section given as a mapping in one file, a value in another
        key = getattr(err, "full_key", "") or "?"
        raise ConfigError(f"{provenance.get(key, 'config')}: conflicting values for '{key}': {_first_line(err)}") from None
    task = raw.get("task")
    if task is None or (isinstance(task, DictConfig) and task.get("name") is None):
        if partial:
            return None
        raise ConfigError(
            "missing required value 'task.name': choose a task, e.g. task: {name: reverse}; "
            f"available tasks: {', '.join(registry.available()) or 'none installed'}"
        )
    if not isinstance(task, DictConfig) or not isinstance(task.get("name"), str):
        raise ConfigError(f"{provenance.get('task', provenance.get('task.name', 'config'))}: "
                          "task must be a mapping with a name, e.g. task: {name: reverse}")
    try:
        return registry.get_task_class(task.name)
    except UserError as err:
        raise ConfigError(f"{provenance.get('task.name', 'config')}: task.name: {err}") from None


def _merge_error(label: str, err: OmegaConfBaseException, schema: DictConfig) -> str:
    key = getattr(err, "full_key", None) or ""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(schema, parent) if parent else schema
    if "not in" in str(err) and isinstance(node, DictConfig):  # unknown key
        valid = [str(k) for k in node.keys()]
        close = did_you_mean(leaf, valid)
        about = field_help(OmegaConf.get_type(node)).get(close or "")
        hint = f"did you mean '{_join(parent, close)}'{f' ({about})' if about else ''}? " if close else ""
        where = f"'{parent}'" if parent else "the top level"
        return f"{label}: unknown key '{key}'; {hint}valid keys at {where}: {', '.join(valid)}"
    return f"{label}: bad value for '{key}': {_first_line(err)}"


def _check_choices(cfg: DictConfig, provenance: dict[str, str]) -> None:
    for key, choices in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value is None or str(value) in choices:
            continue
        close = did_you_mean(str(value), choices)
        hint = f"did you mean '{close}'? " if close else ""
        raise ConfigError(f"{provenance.get(key, 'schema default')}: {key}={value!r} is not a valid choice; "
                          f"{hint}choose one of: {', '.join(choices)}")


def _check_sections(cfg: DictConfig, provenance: dict[str, str], sections: list[str]) -> None:
    """Each section's own `validate()` (the core's ModelConfig included), as ConfigErrors."""
    for section in sections:
        obj = OmegaConf.to_object(cfg[section])
        try:
            obj.validate()
        except ValueError as err:
            raise ConfigError(f"{_source_of(str(err), section, provenance)}: {err}") from None


def _source_of(message: str, section: str, provenance: dict[str, str]) -> str:
    """Where the first key named in a validation message (``key=value``) was set."""
    for name in re.findall(r"([A-Za-z_][\w.]*)=", message):
        for key in (name, f"{section}.{name}"):
            if key in provenance:
                return provenance[key]
    return "config"


def _provenance(sources: list[Source]) -> dict[str, str]:
    """Dotted key → label of the last source that set it (and the sections along the way)."""
    where: dict[str, str] = {}

    def walk(node: Any, prefix: str, label: str) -> None:
        if isinstance(node, dict):
            for k, value in node.items():
                key = _join(prefix, str(k))
                where[key] = label
                walk(value, key, label)

    for label, content in sources:
        walk(OmegaConf.to_container(content, resolve=False), "", label)
    return where


def _at_least(obj: Any, section: str, **minimums: int) -> None:
    for name, low in minimums.items():
        if getattr(obj, name) < low:
            raise ValueError(f"{section}.{name}={getattr(obj, name)} must be >= {low}")


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _first_line(err: Exception) -> str:
    text = getattr(err, "msg", None) or str(err)
    return str(text).strip().splitlines()[0]



def field_help(cls: type) -> dict[str, str]:
    """{field: help} of a config dataclass, from its fields' attribute docstrings (a string
    literal right after the field, as litgpt writes them) or `field(metadata={"help": ...})`, as
    fairseq does; base classes first, so a subclass can redocument a field. Plugins' configs
    are read the same way. Empty where the source cannot be read (e.g. an interactive class)."""
    found: dict[str, str] = {}
    if not dataclasses.is_dataclass(cls):
        return found
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, nxt in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                found[stmt.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
        for f in dataclasses.fields(klass):
            if "help" in f.metadata:
                found[f.name] = str(f.metadata["help"])
    return found


def subsections(cls: type) -> dict[str, type]:
    """{field: dataclass} of the fields of config dataclass `cls` that are sections of their own."""
    found = {}
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(value := f.default_factory()):
            found[f.name] = type(value)
    return found


def describe_keys(cls: type, prefix: str) -> list[str]:
    """The fields of config dataclass `cls` as `<prefix>.<key> (type, default ...)` lines, each
    followed by its help; a nested section points to its own listing."""
    helps, sections, lines = field_help(cls), subsections(cls), []
    for f in dataclasses.fields(cls):
        key = _join(prefix, f.name)
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        if f.name in sections:
            lines.append(f"{key} (section: relpos-lab config --help-keys {key})")
        elif f.default is not dataclasses.MISSING:
            lines.append(f"{key} ({kind}, {'required' if f.default == MISSING else f'default {f.default!r}'})")
        elif f.default_factory is not dataclasses.MISSING:
            lines.append(f"{key} ({kind}, default {f.default_factory()!r})")
        else:
            lines.append(f"{key} ({kind}, required)")
        lines += [f"    {helps[f.name]}"] if f.name in helps else []
    return lines


def section_class(section: str, task: str | None = None) -> type:
    """The config dataclass of a dotted section (`model`, `model.positions`, `trainer`, ...;
    `task` with the task's name): what `relpos-lab config --help-keys` lists."""
    if section.split(".")[0] == "task":
        if not task:
            raise UserError(f"--help-keys {section}: name the task, e.g. --task reverse (`relpos-lab tasks` lists them)")
        cls, parts = registry.get_task_class(task).config_class, section.split(".")[1:]
    else:
        cls, parts = ExperimentConfig, section.split(".") if section else []
    path = "task" if section.startswith("task") else ""
    for part in parts:
        sections = subsections(cls)
        if part not in sections:
            close = did_you_mean(part, list(sections))
            hint = f"did you mean '{_join(path, close)}'? " if close else ""
            raise UserError(f"--help-keys {section}: no section '{_join(path, part)}'; {hint}"
                            f"sections there: {', '.join(_join(path, s) for s in sections) or 'none'}")
        cls, path = sections[part], _join(path, part)
    return cls


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


__all__ = [
    "ClusterConfig", "DataConfig", "ExperimentConfig", "ModelConfig", "OptimConfig", "TrainerConfig",
    "LoggingConfig", "CHOICES", "load_config", "config_from_container", "compose", "to_yaml",
]
