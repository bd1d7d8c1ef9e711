"""Make a run directory for a cluster job: config.yaml written once, so a requeued job resumes.

The job calls this first (`python -m jobs.launch --preset P --prepare-run RUN_DIR ...`). On a requeue the
directory already holds config.yaml, checkpoints and shards: it is kept as it is, never rewritten, so
the restarted roles read the same config and the trainer resumes from its newest checkpoint. Only
rendezvous.json goes: the addresses in it (controller, MPI port, weight broadcast) were the previous
attempt's, and a restarted role must wait for the new ones instead of calling dead ones.
"""
from __future__ import annotations

from pathlib import Path

from agentrl.config import RunConfig, config_from_dict, dump_config, load_config, to_dict
from agentrl.launch import rendezvous
from agentrl.launch.apptainer import require_apptainer, sandbox_options
from agentrl.launch.fork import fork_warm_start


def run_config(preset: str, overrides: list[str], run_dir: Path) -> RunConfig:
    """The preset and overrides with name/run_root pointing at `run_dir`, and the launcher's own
    settings applied (the os task's sandbox image from cluster.env.os_sandbox_image)."""
    cfg = load_config(preset, [*overrides, f"name={run_dir.name}", f"run_root={run_dir.parent}"])
    image = cfg.cluster.env.os_sandbox_image
    if image and "os" in cfg.envs.tasks:
        data = to_dict(cfg)
        data["envs"]["task_options"] = sandbox_options(data["envs"]["task_options"], image)
        cfg = config_from_dict(data)
    return cfg


def prepare_run(preset: str, overrides: list[str], run_dir: str | Path) -> tuple[RunConfig, bool]:
    """Write run_dir/config.yaml unless it exists. Returns (the run's config, whether it is a resume)."""
    run_dir = Path(run_dir)
    path = run_dir / "config.yaml"
    if path.exists():
        (run_dir / rendezvous.FILENAME).unlink(missing_ok=True)
        return load_config(str(path)), True
    cfg = run_config(preset, overrides, run_dir)
    if cfg.cluster.env.apptainer_image:
        require_apptainer("cluster.env.apptainer_image")
    if cfg.cluster.env.os_sandbox_image:
        require_apptainer("cluster.env.os_sandbox_image")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    if cfg.trainer.warm_start_from:  # before config.yaml: a requeue after a failed copy starts over
        print(fork_warm_start(cfg, run_dir), flush=True)
    dump_config(cfg, path)
    return cfg, False
