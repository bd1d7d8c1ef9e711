"""Start a run from another run's warm start (`trainer.warm_start_from`) instead of repeating it.

A seed's RL run, its same-compute control (`trainer.update=warm_start`) and its ablations (`algo.*`) all begin with the
same warm start and the same evaluation of its weights; on 2 CPU cores those take about an hour of a multi-task
run. A fresh run dir given `trainer.warm_start_from=<the first run's dir>` gets, before any role starts:

    ckpt/step-0/           the warm start's checkpoint (weights, its optimizer, schedule and draws: a control run
                           continues it exactly as if it had run it itself)
    shards/expert-0/       the expert demonstrations it trained on
    ckpt/reference.*       the KL reference, when the source has one
    model/                 the model the source built for itself, when `model.path` is empty (the demo's)
    report/before_rl.json  the evaluation before RL (and its eval-v0 and eval_sampled-v0 files)

and then runs as a resumed run from step 0: the trainer loads the checkpoint, the rollout finds the
demonstrations and the evaluation written. Only settings that come after the warm start may differ
(`MAY_DIFFER`); anything that shapes the warm start or the evaluation before RL must be the source's.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from agentrl.config import RunConfig, load_config, to_dict
from agentrl.launch.continuing import flat_config
from agentrl.run_files import CKPT_DIR, EXPERT_SHARDS, REFERENCE_FILE, STATE_FILE, WARM_FILE

# What runs after the warm start, or only decides how and where the run runs: these may differ from the source.
MAY_DIFFER_PREFIXES = ("algo.", "cluster.", "controller.", "transport.", "monitor.")
MAY_DIFFER = ("name", "run_root", "trainer.warm_start_from", "trainer.steps", "trainer.update", "trainer.lr",
              "trainer.warmup_steps", "trainer.weight_decay", "trainer.grad_clip", "trainer.control_batch",
              "trainer.micro_batch_tokens", "trainer.checkpoint_every", "trainer.keep_checkpoints",
              "trainer.activation_checkpointing", "rollout.groups_per_task", "rollout.group_size",
              "rollout.lagging_prob", "rollout.concurrency", "rollout.linger_ms", "rollout.env_retries",
              "rollout.env_wait_s", "rollout.env_latency_s", "rollout.env_latency_sigma", "envs.workers",
              "envs.slots", "envs.drain_s")

REPORT_FILES = ("before_rl.json", "eval-v0.json", "eval_sampled-v0.json")


def may_differ(key: str) -> bool:
    return key in MAY_DIFFER or key.startswith(MAY_DIFFER_PREFIXES)


def mismatches(source: RunConfig, cfg: RunConfig) -> list[str]:
    """The settings of `cfg` that shape the warm start or the evaluation before RL and differ from `source`'s."""
    old, new = flat_config(to_dict(source)), flat_config(to_dict(cfg))
    return [f"{k} ({old.get(k)!r} there, {new.get(k)!r} here)" for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k) and not may_differ(k)]


def fork_warm_start(cfg: RunConfig, run_dir: Path) -> str:
    """Copy the warm start of the run in `cfg.trainer.warm_start_from` into the fresh `run_dir`; returns a line
    saying what was copied. Raises ValueError (naming what is wrong) when the source cannot be shared."""
    source = Path(cfg.trainer.warm_start_from).resolve()
    if source == run_dir.resolve():
        raise ValueError("trainer.warm_start_from names this run's own directory")
    if not (source / "config.yaml").is_file():
        raise ValueError(f"trainer.warm_start_from: {source} holds no run (no config.yaml)")
    differ = mismatches(load_config(str(source / "config.yaml")), cfg)
    if differ:
        raise ValueError(f"trainer.warm_start_from: the run in {source} made a different warm start or evaluation "
                         f"before RL: {', '.join(differ[:8])}" + (f" and {len(differ) - 8} more" if len(differ) > 8
                                                                  else ""))
    step0 = source / CKPT_DIR / "step-0"
    demos = source / EXPERT_SHARDS
    if not ((step0 / STATE_FILE).is_file() and (step0 / WARM_FILE).is_file()):
        raise ValueError(f"trainer.warm_start_from: {source} has no finished warm start yet (no ckpt/step-0 with "
                         f"{WARM_FILE}; runs with trainer.checkpoint_every=0 write none)")
    if not demos.is_dir():
        raise ValueError(f"trainer.warm_start_from: {source} has no expert demonstrations (shards/expert-0)")
    for there, here in ((step0, run_dir / CKPT_DIR / "step-0"), (demos, run_dir / EXPERT_SHARDS)):
        shutil.rmtree(here, ignore_errors=True)  # a copy an earlier attempt left half done
        shutil.copytree(there, here)
    copied = [f"{CKPT_DIR}/step-0", EXPERT_SHARDS]
    if not cfg.model.path and (source / "model").is_dir():  # the model the source built for itself (the demo's)
        shutil.rmtree(run_dir / "model", ignore_errors=True)
        shutil.copytree(source / "model", run_dir / "model")
        copied.append("model")
    if (source / CKPT_DIR / REFERENCE_FILE).is_file():
        shutil.copy2(source / CKPT_DIR / REFERENCE_FILE, run_dir / CKPT_DIR / REFERENCE_FILE)
        copied.append(f"{CKPT_DIR}/{REFERENCE_FILE}")
    (run_dir / "report").mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES:
        if (source / "report" / name).is_file():
            shutil.copy2(source / "report" / name, run_dir / "report" / name)
            copied.append(f"report/{name}")
    (run_dir / "report" / "warm_start_from.json").write_text(json.dumps({"source": str(source), "copied": copied}))
    evaluated = "report/before_rl.json" in copied
    return (f"starting from the warm start of {source} ({', '.join(copied)})"
            + ("" if evaluated else "; its evaluation before RL had not finished: this run evaluates v0 itself"))
