"""Experiment configs: the schema (schema.py), loading and validation (load.py), key help (help.py).

Nothing here imports Lightning: `relpos-lab config` and every config error answer without it.
"""
from relpos_lab.config.load import COMMAND_LINE, compose, config_from_container, load_config, to_yaml
from relpos_lab.config.schema import (
    ClusterConfig,
    DataConfig,
    ExperimentConfig,
    LoggingConfig,
    OptimConfig,
    TrainerConfig,
    WandbConfig,
)

__all__ = [
    "COMMAND_LINE", "ClusterConfig", "DataConfig", "ExperimentConfig", "LoggingConfig", "OptimConfig",
    "TrainerConfig", "WandbConfig", "compose", "config_from_container", "load_config", "to_yaml",
]
