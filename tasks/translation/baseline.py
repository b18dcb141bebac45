"""The trivial baseline of a translation experiment: copy each source sentence unchanged.

Software messages leave names, numbers, options and format strings untranslated, so copying the
English source already scores a real BLEU against German references; a model has learned to
translate only when it beats that. This prints the copy baseline of an experiment config's split,
scored by sacrebleu exactly as the model's hypotheses are, with the signature:

    python -m relpos_lab_tasks.translation.baseline configs/experiment/translation_gettext_shaw.yaml

(``--split valid`` for the validation set; ``key=value`` overrides as for ``relpos-lab train``).
"""
from __future__ import annotations

import argparse
import json
import sys

from omegaconf import OmegaConf

from relpos_lab.api import UserError, registry
from relpos_lab.config import load_config
from relpos_lab_tasks.translation.task import TranslationTask


def copy_baseline(config: str, split: str = "test", overrides: list[str] = ()) -> dict:
    cfg = load_config(config, list(overrides))
    task = registry.create_task(OmegaConf.to_object(cfg.task), seed=cfg.seed)
    if not isinstance(task, TranslationTask):
        raise UserError(f"{config}: task '{cfg.task.name}' is not a translation task")
    return {"config": config, "split": split, "baseline": "copy source", **task.copy_baseline(split)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relpos_lab_tasks.translation.baseline",
                                     description="BLEU/chrF of copying the source: the baseline to beat.")
    parser.add_argument("config", help="experiment YAML file of a translation task")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.add_argument("--split", default="test")
    args = parser.parse_args(argv)
    try:
        result = copy_baseline(args.config, args.split, args.overrides)
    except UserError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
