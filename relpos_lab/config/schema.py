"""The schema of an experiment config: one dataclass per section, each field documented.

Plain dataclasses (OmegaConf structured configs) over torch-only model pieces, so that reading and
checking a config never imports Lightning. A task's own section comes from its `config_class`
(relpos_lab.api); loading and validation are in load.py, the help texts in help.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from relpos_lab.core.compiling import MODES as COMPILE_MODES
from relpos_lab.core.init import INITS
from relpos_lab.core.transformer import ARCHITECTURES, MODEL_IMPLS, ModelConfig

SCHEDULERS = ("inverse_sqrt", "cosine", "constant")
PRECISIONS = ("32", "bf16-mixed", "16-mixed")
EVALUATE = ("best", "last")  # trainer.evaluate: which checkpoint the final evaluation reads
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
WANDB_MODES = ("auto", "offline", "online", "disabled")
LOG_CHECKPOINTS = {"none": False, "best": True, "all": "all"}  # log_checkpoints -> Lightning's log_model
WANDB_RESUMES = ("allow", "rewind")


@dataclass
class DataConfig:
    batch_size: int = 64
    """examples per device and step (global batch = × devices × nodes)"""
    eval_batch_size: int = 256
    """examples per evaluation batch (per device)"""
    num_workers: int = 0
    """DataLoader worker processes; 0 loads in the training process"""
    pad_to_multiple: int = 1
    """pad each batch's lengths up to a multiple of this (tasks built on Seq2SeqTask): a compiled model then meets
    few shapes (reduce-overhead records a CUDA graph per shape); the padding is masked, the numbers unchanged"""

    def validate(self) -> None:
        _at_least(self, "data", batch_size=1, eval_batch_size=1, num_workers=0, pad_to_multiple=1)


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
    stop_at: float | None = None
    """stop early once a validation's main metric passes this (e.g. exact match 0.99); None: train max_steps"""
    val_every_n_steps: int = 1000
    """training batches between validations (across epochs); the last step is always validated too"""
    evaluate: str = "best"
    """best | last: the checkpoint results.json evaluates: the best validated step by the task's main metric (the
    last step included), or last.ckpt"""
    checkpoint_every_n_steps: int = 0
    """refresh last.ckpt every N steps; 0: at each validation"""
    checkpoint_every_minutes: float = 10.0
    """also refresh last.ckpt when this many minutes passed since the last one; 0: off"""
    log_every_n_steps: int = 50
    """training steps between logged metrics, and between progress lines when stdout is not a terminal"""
    gradient_clip_val: float = 0.0
    """clip the global gradient norm; 0: off"""
    accumulate_grad_batches: int = 1
    """batches per optimizer step"""
    num_sanity_val_steps: int = 2
    """validation batches run before training starts (catches evaluation bugs early)"""
    deterministic: bool = False
    """torch's deterministic algorithms (slower)"""
    threads: int = 0
    """CPU threads per process; 0: the CPUs this process may use (affinity, SLURM_CPUS_PER_TASK) shared among the
    node's processes"""
    enable_progress_bar: bool = True
    """progress on the console: a bar over the steps at a terminal, plain lines in a log file (a SLURM .out)"""
    enable_model_summary: bool = True
    """print the model's parameter count at the start (Lightning's table of its layers with -v)"""
    eval_dropout: bool = False
    """evaluate with every dropout of the model on, the masks seeded from `seed` (a rerun gives the same number),
    as DeepMind's reference code evaluates; false: dropout off at evaluation, as usual"""
    compile: str = "none"
    """none | default | reduce-overhead | max-autotune: torch.compile's mode for the model's forward and backward in
    training and evaluation (decoding steps stay eager); none: eager"""
    rendezvous_timeout_seconds: float = 300.0
    """a distributed run: seconds each process waits for the others at the start (at MASTER_ADDR:MASTER_PORT; under
    SLURM the job's first node) before it fails in one line naming that address"""

    def validate(self) -> None:
        _at_least(self, "trainer", devices=1, num_nodes=1, max_steps=1, val_every_n_steps=1,
                  checkpoint_every_n_steps=0, threads=0, log_every_n_steps=1, accumulate_grad_batches=1,
                  num_sanity_val_steps=0)
        if self.checkpoint_every_minutes < 0:
            raise ValueError(f"trainer.checkpoint_every_minutes={self.checkpoint_every_minutes} must be >= 0")
        if self.rendezvous_timeout_seconds <= 0:
            raise ValueError(f"trainer.rendezvous_timeout_seconds={self.rendezvous_timeout_seconds} must be > 0")
        if self.gradient_clip_val < 0:
            raise ValueError(f"trainer.gradient_clip_val={self.gradient_clip_val} must be >= 0")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"trainer.compile={self.compile!r}; choose one of {', '.join(COMPILE_MODES)}")


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
    runs_per_gpu: int = 1
    """`sweep --slurm`: grid points trained at once in one array task, on its one GPU, each in its own job step
    (with cpus_per_task CPUs), run directory and W&B run; only runs of trainer.devices=1, num_nodes=1. 1: a task
    per point"""
    stack: int = 0
    """`sweep --slurm`: grid points that differ only in what a stack varies (sweep --stack) train as one stacked
    model in one array task, up to this many; the others a task each. 0: a task per point (`sweep --slurm --stack K`
    sets it)"""

    def validate(self) -> None:
        _at_least(self, "cluster", cpus_per_task=1, array_parallelism=0, signal_seconds=1, runs_per_gpu=1, stack=0)
        if self.stack > 1 and self.runs_per_gpu > 1:
            raise ValueError(f"cluster.stack={self.stack} and cluster.runs_per_gpu={self.runs_per_gpu}: a task trains "
                             "one stack or several packed runs, not both; set one of them to its default")


@dataclass
class WandbConfig:
    mode: str = "auto"
    """auto (offline unless WANDB_MODE or an API key says online) | offline (always: debug) | online | disabled"""
    project: str = "relpos_lab"
    """W&B project"""
    entity: str | None = None
    """W&B entity (user or team); None: your default"""
    group: str | None = None
    """default: the experiment (or sweep) name, cfg.name"""
    tags: list[str] = field(default_factory=list)
    """W&B tags of the run"""
    labels: dict[str, str] = field(default_factory=dict)
    """a sweep point's grid labels, axis -> label (`relpos-lab sweep` sets them, and group to the sweep's cell):
    W&B config keys sweep.<axis>, to filter and group by"""
    init_timeout: float = 30.0
    """online: seconds the start may take before the run logs offline instead, in its own directory, to sync later
    (a node that cannot reach the server at all goes offline at once)"""
    log_checkpoints: str = "none"
    """none | best | all: upload checkpoints as W&B artifacts of type model (offline: recorded for wandb sync):
    best, once the fit ends, the best checkpoint (alias best) and last.ckpt; all, each checkpoint as it is saved"""
    resume: str = "allow"
    """allow | rewind: how a resumed attempt continues the W&B run. allow: W&B's plain resume; what the run holds
    is kept and only rows it lacks are logged. rewind: W&B's resume_from, which cuts the history back to the
    checkpoint and logs from there (needs an account with run rewinding)"""


@dataclass
class LoggingConfig:
    root: str = "runs"
    """run directories go to <root>/<name>/<slug>-<hash8>"""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases tracking"""
    num_samples: int = 8
    """sample predictions shown per evaluation (W&B table)"""
    inspect: bool = True
    """after the final evaluation, `relpos-lab inspect` the best checkpoint (attention by relative offset,
    the scheme's learned tables or biases) when the model has a relative scheme; false: skip it"""


@dataclass
class ExperimentConfig:
    name: str = MISSING
    """experiment name; defaults to the config file's stem"""
    seed: int = 0
    """seeds model initialisation, data order and the synthetic tasks' data"""
    resume: bool = True
    """an interrupted run continues from its newest checkpoint; false: refuse to touch a run directory that
    holds an earlier attempt (`train --force` starts over, moving the old directory aside)"""
    extend: bool | None = None
    """a run of this experiment that differs only in its budget (trainer.max_steps, val_every_n_steps, stop_at) is
    continued in its own directory from its newest checkpoint, one history (`train --extend`); false: train a separate
    run; null: refuse, naming that run and --extend"""
    debug: bool = False
    """true (the `debug` overlay sets it): the task's data cut small by its config's `for_debug()` (a few
    evaluation lengths and examples, a small training set), so that any experiment checks end to end in seconds"""
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
    "trainer.evaluate": EVALUATE,
    "trainer.compile": COMPILE_MODES,
    "model.architecture": ARCHITECTURES,
    "model.attention_impl": MODEL_IMPLS,
    "model.init": INITS,
    "logging.wandb.mode": WANDB_MODES,
    "logging.wandb.log_checkpoints": tuple(LOG_CHECKPOINTS),
    "logging.wandb.resume": WANDB_RESUMES,
}

# Keys taken out of the schema because their meaning was wrong, with what replaces them: a config
# that still sets one is told why, rather than offered a look-alike.
REMOVED_KEYS: dict[str, str] = {
    "task.loss_per_example": "it summed the loss over each example's output slots, where DeepMind's reference "
                             "takes the mean over them; set task.loss_on_padding=true for the reference's loss",
}

def _at_least(obj: Any, section: str, **minimums: int) -> None:
    for name, low in minimums.items():
        if getattr(obj, name) < low:
            raise ValueError(f"{section}.{name}={getattr(obj, name)} must be >= {low}")
