"""`sweep FILE --list --step-times BENCH.json`: what a sweep costs, from step times `bench model` measured.

`bench model --json` times a training step of each candidate scheme at one model shape, eager and
(with --compile) compiled, on the machine it ran on. A point costs its trainer.max_steps times the
step of its scheme's candidate (`model-<scheme>`, Shaw's `model-shaw-<model.attention_impl>`, a
randomized one `...-random<max_random_len>`), compiled plus the compile, once. The step times are
taken as they were measured: a sweep whose model differs from the bench's shape (width, heads,
layers, batch, length) costs what a step at the bench's shape costs, which the estimate says.

With `--stack K` (a file of `bench model --stack K'`): a stack of n ≤ K' points costs one step of
the K'-run stack per step (a GPU's step is bound by the host, not by K), points that train alone
their eager step; with `cluster.runs_per_gpu` P > 1, packing is priced as its best case, eager / P
(measured, it is less: the processes share the GPU's time). The file's aten ops per run-step,
counted by the bench, are printed beside.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from relpos_lab.api.errors import UserError, shown_path

SHAPE_KEYS = {"d_model": "model.d_model", "heads": "model.n_heads", "d_ff": "model.d_ff",
              "architecture": "model.architecture"}
"""The bench's shape keys that a point's config states, and where."""


@dataclass
class StepTimes:
    """One `bench model --json` file: median ms per training step by candidate name."""
    path: Path
    device: str
    eager_ms: dict[str, float]
    compiled_ms: dict[str, float]  # (without the compile)
    compile_s: dict[str, float]
    shape: dict
    stacked: dict[str, tuple[int, float]] = field(default_factory=dict)  # candidate -> (K, ms of its K-run step)
    ops: dict[str, float] = field(default_factory=dict)  # row name -> aten ops per run-step (bench --stack)

    @classmethod
    def read(cls, path: str | Path) -> StepTimes:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            if data.get("bench") != "model":
                raise ValueError(f"it is a `bench {data.get('bench')}` file")
            results = data["results"]
        except OSError as err:
            raise UserError(f"--step-times {shown_path(path)}: {err.strerror}; write the file with "
                            "`relpos-lab bench model ... --json FILE`") from None
        except (ValueError, KeyError, AttributeError) as err:
            raise UserError(f"--step-times {shown_path(path)}: not a `relpos-lab bench model --json` file ({err}); "
                            "write one with `relpos-lab bench model ... --json FILE`") from None
        eager, compiled, compile_s, stacked, ops = {}, {}, {}, {}, {}
        for r in results:
            name = r["name"]
            if "ops_per_run_step" in r.get("extra", {}):
                ops[name] = r["extra"]["ops_per_run_step"]
            if stack := re.fullmatch(r"(.+)-stack(\d+)", name):
                stacked[stack[1]] = (int(stack[2]), r["median_ms"])
            elif name.endswith("-compiled"):
                compiled[name.removesuffix("-compiled")] = r["median_ms"]
                compile_s[name.removesuffix("-compiled")] = r.get("extra", {}).get("compile_s", 0.0)
            elif "length" in r.get("shape", {}):  # (generation rows have no training step)
                eager[name] = r["median_ms"]
        shape = results[0].get("shape", {}) if results else {}
        machine = data.get("machine", {})
        return cls(path, machine.get("gpu") or machine.get("device", "?"), eager, compiled, compile_s, shape,
                   stacked, ops)


def candidate(cfg: DictConfig) -> str:
    """The `bench model` candidate a point's model is: its scheme (and implementation, for Shaw)."""
    positions = cfg.model.positions
    name = f"model-shaw-{cfg.model.attention_impl}" if positions.scheme == "shaw" else f"model-{positions.scheme}"
    random_len = OmegaConf.select(positions, "max_random_len", default=None)
    return name + (f"-random{random_len}" if random_len else "")


@dataclass
class Estimate:
    """A sweep's cost in device-hours, eager and compiled, over the points it could price."""
    device: str
    eager_hours: float = 0.0
    compiled_hours: float | None = None
    priced: int = 0
    missing: dict[str, int] = field(default_factory=dict)  # candidate -> points without a step time
    other_shape: dict[str, tuple] = field(default_factory=dict)  # key -> (bench's, the sweep's values)
    stacked: Stacked | None = None  # with --stack
    packed_by: int = 1  # cluster.runs_per_gpu

    def lines(self) -> list[str]:
        compiled = (f", compiled {_hours(self.compiled_hours)} (compiles included)"
                    if self.compiled_hours is not None else " (no compiled step times: bench model --compile)")
        packed = (f", packed {self.packed_by} a GPU at best {_hours(self.eager_hours / self.packed_by)}"
                  if self.packed_by > 1 else "")
        out = [f"estimated on {self.device}: {_hours(self.eager_hours)} eager{compiled}{packed}, for {self.priced} "
               "point(s) at their trainer.max_steps"]
        if self.stacked is not None:
            out += self.stacked.lines()
        if self.missing:
            out.append("no step time for " + ", ".join(f"{name} ({n} points)" for name, n in self.missing.items())
                       + ": add the scheme to bench model (--schemes, --impl, --max-random-len)")
        if self.other_shape:
            out.append("measured at another shape than the sweep's: " + ", ".join(
                f"{key} {bench} (sweep: {', '.join(map(str, sorted(ours)))})"
                for key, (bench, ours) in self.other_shape.items()) + "; the estimate takes the bench's step as it is")
        return out


def estimate(configs: list[DictConfig], times: StepTimes, groups: list[list[int]] | None = None) -> Estimate:
    """The cost of the points whose (composed) configs these are, unfinished or not; with `groups`,
    also trained as those stacks."""
    out = Estimate(times.device, compiled_hours=0.0 if times.compiled_ms else None,
                   packed_by=max((int(OmegaConf.select(c, "cluster.runs_per_gpu", default=1)) for c in configs),
                                 default=1))
    if groups is not None:
        out.stacked = estimate_stacked(configs, groups, times)
    seen: dict[str, set] = {key: set() for key in SHAPE_KEYS}
    for cfg in configs:
        for key, path in SHAPE_KEYS.items():
            seen[key].add(OmegaConf.select(cfg, path))
        name, steps = candidate(cfg), cfg.trainer.max_steps
        if name not in times.eager_ms:
            out.missing[name] = out.missing.get(name, 0) + 1
            continue
        out.priced += 1
        out.eager_hours += steps * times.eager_ms[name] / 3.6e6
        if out.compiled_hours is not None:  # (None once a priced point has no compiled step)
            out.compiled_hours = ((out.compiled_hours + (steps * times.compiled_ms[name] / 1e3
                                                         + times.compile_s[name]) / 3600)
                                  if name in times.compiled_ms else None)
    for key, values in seen.items():
        bench = times.shape.get(key, "encoder_decoder" if key == "architecture" else None)
        if bench is not None and values != {bench}:
            out.other_shape[key] = (bench, values)
    return out


@dataclass
class Stacked:
    """The sweep trained with --stack: its stacks at the measured stacked step, the rest alone."""
    hours: float = 0.0
    stacks: int = 0
    alone: int = 0
    measured: dict[str, int] = field(default_factory=dict)  # candidate -> the K its stacked step was measured at
    unmeasured: dict[str, int] = field(default_factory=dict)  # candidate -> stacked points without a stacked step
    ops: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # candidate -> (solo, stacked, K)

    def lines(self) -> list[str]:
        out = [f"stacked (--stack): {_hours(self.hours)}, {self.stacks} stack(s) at the stacked step bench model "
               f"measured ({', '.join(f'{name} K={k}' for name, k in self.measured.items()) or 'none'}), "
               f"{self.alone} point(s) alone at their eager step"]
        if self.unmeasured:
            out.append("no stacked step for " + ", ".join(f"{n} ({c} points)" for n, c in self.unmeasured.items())
                       + ": they are priced alone; measure with bench model --stack K")
        if self.ops:
            out.append("aten ops per run-step (bench model's count): " + "; ".join(
                f"{name} {solo:,.0f} alone, {stacked:,.1f} stacked at K={k} (1/{solo / stacked:.0f})"
                for name, (solo, stacked, k) in self.ops.items()))
        return out


def estimate_stacked(configs: list[DictConfig], groups: list[list[int]], times: StepTimes) -> Stacked:
    """The cost of `groups` (indices into `configs`, as `stack_groups` made them) trained as stacks."""
    out = Stacked()
    for group in groups:
        cfg = configs[group[0]]
        name, steps = candidate(cfg), cfg.trainer.max_steps
        if len(group) > 1 and name in times.stacked:
            k, ms = times.stacked[name]
            out.hours += math.ceil(len(group) / k) * steps * ms / 3.6e6
            out.stacks += 1
            out.measured[name] = k
            solo, stacked = times.ops.get(name), times.ops.get(f"{name}-stack{k}")
            if solo and stacked:
                out.ops[name] = (solo, stacked, k)
            continue
        if len(group) > 1:
            out.unmeasured[name] = out.unmeasured.get(name, 0) + len(group)
        out.alone += len(group)
        out.hours += sum(configs[i].trainer.max_steps * times.eager_ms.get(name, 0.0) for i in group) / 3.6e6
    return out


def _hours(hours: float) -> str:
    return f"{hours:,.1f} device-hours" if hours >= 1 else f"{hours * 60:.1f} device-minutes"
