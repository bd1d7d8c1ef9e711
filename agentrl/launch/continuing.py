"""Whether a run directory can be continued with a given config: `python -m jobs.train` on an unfinished run
dir resumes it (the trainer from its newest checkpoint, the rollout shards drained first) only if the config
makes the same experiment."""
from __future__ import annotations

from pathlib import Path

from agentrl.config import RunConfig, load_config, to_dict


def flat_config(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# Fields a continued run may change: more steps extend it; how long roles may wait, restarts, and the engines'
# KV-cache size (how many episodes fit at once, not what they sample) are the operator's business. Anything else
# would make the second half a different experiment.
RESUME_MAY_CHANGE = ("trainer.steps", "cluster.role_timeout_s", "cluster.time_limit_s", "cluster.max_restarts",
                     "cluster.rollout.kv_cache_gib")


def resume_check(run_dir: Path, cfg: RunConfig) -> str | None:
    """Why the run in `run_dir` cannot be continued with `cfg` (None: it can)."""
    old = flat_config(to_dict(load_config(str(run_dir / "config.yaml"))))
    new = flat_config(to_dict(cfg))
    diff = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k not in RESUME_MAY_CHANGE)
    if diff:
        return "its config differs in " + ", ".join(f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in diff[:8])
    return None
