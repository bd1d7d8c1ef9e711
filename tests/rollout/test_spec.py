"""`RolloutSpec.from_config`: the rollout section as the config holds it, and the values derived from other
sections, each worked out there once."""
from __future__ import annotations

from agentrl.config import load_config
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.collect import Retry
from agentrl.rollout.spec import RolloutSpec


def test_the_spec_holds_the_section_and_derives_the_rest() -> None:
    cfg = load_config("smoke", ["rollout.env_retries=1", "rollout.env_wait_s=30", "cluster.role_timeout_s=90",
                                "seed=7", "transport.poll_s=0.1"])
    spec = RolloutSpec.from_config(cfg)
    assert spec.rollout is cfg.rollout  # read as is, never copied field by field
    assert spec.tasks == ("lookup",) and spec.demonstrations and spec.train
    assert spec.limits == EpisodeLimits(max_turns=3, max_model_len=384, max_new_tokens=32)
    assert spec.retry == Retry(max_retries=1, capacity_wait_s=30.0)
    assert (spec.wait_timeout_s, spec.seed, spec.poll_s) == (90.0, 7, 0.1)


def test_demonstrations_come_with_a_warm_start_and_training_episodes_with_rl() -> None:
    assert not RolloutSpec.from_config(load_config("smoke", ["trainer.warm_start_steps=0"])).demonstrations
    control = RolloutSpec.from_config(load_config("smoke", ["trainer.update=warm_start"]))
    assert control.demonstrations and not control.train  # its steps imitate; its ranks only evaluate


def test_task_names_come_from_the_config() -> None:
    cfg = load_config("smoke", ["envs.tasks=[lookup, 'agentrl.tasks.example:GuessTask']"])
    assert RolloutSpec.from_config(cfg).tasks == ("lookup", "guess")
