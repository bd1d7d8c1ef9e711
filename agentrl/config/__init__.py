"""One typed config tree for a run: frozen dataclasses, YAML presets, command-line overrides.

`load_config("demo", ["trainer.lr=1e-5"])` reads `agentrl/presets/demo.yaml`, applies the overrides
(dotted paths, values parsed as YAML scalars), checks every field's type and range, and returns a frozen
`RunConfig`. Any problem raises `ConfigError` naming the field, at load time, before a process starts.
Every role takes the whole `RunConfig` and reads a setting where it uses it (the trainer step reads
`cfg.trainer.micro_batch_tokens`, a rollout rank `cfg.rollout.lagging_prob` where it builds its engines).

By place: `model` (the model and its conversation format), `sections` (controller, envs, rollout, trainer, algo,
transport, monitor), `cluster` (where the roles run: schedule, topology, Slurm), `run` (`RunConfig`, the checks
across sections and the derived `PipelineShape`), `load` (presets, overrides, dumping), `typed` (a value read
against its field's annotation; the keys that moved or were renamed), `task_options` (each task's options checked
against the dataclass it declares, the message budget and the worker's deadline for a call, the task names a rank
plays). Import from here. A key renamed (`RENAMED`) is still read under its old name, with a warning.
"""
from agentrl.config.cluster import (
    ClusterConfig,
    EnvTopology,
    RolloutTopology,
    SlurmGroupConfig,
    TrainerTopology,
    slurm_seconds,
)
from agentrl.config.errors import ConfigError
from agentrl.config.load import (
    PRESETS_DIR,
    PRETRAINED_DEFAULTS,
    SCRATCH_TUNED,
    Scalar,
    config_from_dict,
    dump_config,
    load_config,
    parse_override,
    to_dict,
)
from agentrl.config.model import (
    OWN_TOOLS,
    TEMPLATES_DIR,
    ModelConfig,
    chat_template_file,
    chat_template_names,
    chat_template_text,
    own_tools,
)
from agentrl.config.run import PipelineShape, RunConfig
from agentrl.config.sections import (
    AlgoConfig,
    ControllerConfig,
    EnvsConfig,
    MonitorConfig,
    RolloutConfig,
    TrainerConfig,
    TransportConfig,
)
from agentrl.config.typed import RENAMED, RENAMED_VALUES, new_names

__all__ = [
    "OWN_TOOLS", "PRESETS_DIR", "PRETRAINED_DEFAULTS", "RENAMED", "RENAMED_VALUES", "SCRATCH_TUNED", "TEMPLATES_DIR",
    "AlgoConfig", "ClusterConfig", "ConfigError", "ControllerConfig", "EnvTopology", "EnvsConfig", "ModelConfig",
    "MonitorConfig", "PipelineShape", "RolloutConfig", "RolloutTopology", "RunConfig", "Scalar", "SlurmGroupConfig",
    "TrainerConfig", "TrainerTopology", "TransportConfig", "chat_template_file", "chat_template_names",
    "chat_template_text", "config_from_dict", "dump_config", "load_config", "new_names", "own_tools", "parse_override",
    "slurm_seconds", "to_dict",
]
