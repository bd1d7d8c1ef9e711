"""The cluster topology in the config: every bad value is refused at load time, naming its field; the
paper presets load and ask for the GPUs their comments say."""
from __future__ import annotations

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.launch import topology


@pytest.mark.parametrize("override,field,words", [
    ("cluster.launcher=ray", "cluster.launcher", "local | slurm"),
    ("cluster.controller_placement=own", "cluster.controller_placement", "env | trainer"),
    ("cluster.trainer.gpus_per_node=4", "cluster.trainer.ranks_per_node", "one trainer rank per GPU"),
    ("cluster.trainer.slurm.time=2h", "cluster.trainer.slurm.time", "not a Slurm time"),
    ("cluster.rollout.slurm.mem=lots", "cluster.rollout.slurm.mem", "not a Slurm memory size"),
    ("cluster.env.slurm.partition=a b", "cluster.env.slurm.partition", "spaces"),
    ("cluster.rollout.gpus_per_node=3", "cluster.rollout.gpus_per_node", "= 1"),
    ("cluster.rollout.gpu_memory_utilization=1.5", "cluster.rollout.gpu_memory_utilization", "(0, 1]"),
    ("cluster.rollout.dtype=fp8", "cluster.rollout.dtype", "(auto | bfloat16 | float16 | float32)"),
    ("cluster.mpi=pmi3", "cluster.mpi", "unknown value 'pmi3' (pmi2 | pmix | none)"),
    ("cluster.gpu_binding=map", "cluster.gpu_binding", "(gpus-per-task | gres)"),
    ("cluster.schedule=later", "cluster.schedule", "(sync | async)"),
    ("cluster.setup=['module load x', '']", "cluster.setup[1]", "one non-empty shell line"),
    ("cluster.trainer.slurm.mem_per_gpu=80", "cluster.trainer.slurm.mem_per_gpu", "needs gpus_per_node > 0"),
    ("cluster.env.slurm.mem_per_gpu=lots", "cluster.env.slurm.mem_per_gpu", "not a Slurm memory size"),
    ("cluster.trainer.collective_timeout_s=3600", "cluster.trainer.collective_timeout_s",
     "shorter than cluster.trainer.slurm.time (01:00:00 = 3600 s)"),
    ("cluster.rollout.max_num_seqs=-1", "cluster.rollout.max_num_seqs", ">= 0"),
    ("rollout.lagging_prob=2", "rollout.lagging_prob", "[0, 1]"),
    ("rollout.lagging_prob=0.5", "rollout.lagging_prob", "lagging_engines_per_rank is 0"),
    ("cluster.rollout.lagging_prob=0.25", "cluster.rollout.lagging_prob", "moved to rollout.lagging_prob"),
    ("cluster.rollout.linger_ms=5", "cluster.rollout.linger_ms", "moved to rollout.linger_ms"),
    ("rollout.kv_cache_gib=2", "rollout.kv_cache_gib", "moved to cluster.rollout.kv_cache_gib"),
    ("cluster.rollout.kv_cache_memory_gib=8", "cluster.rollout.kv_cache_memory_gib",
     "moved to cluster.rollout.kv_cache_gib"),
    ("cluster.rollout.kv_cache_gib=1.5", "cluster.rollout.kv_cache_gib", "whole number of GiB for CPU engines"),
    ("cluster.rollout.ranks=1001", "cluster.rollout.ranks", "<= 1000"),
    ("cluster.rollout.tensor_parallel_size=0", "cluster.rollout.tensor_parallel_size", ">= 1"),
    ("cluster.env.slots_per_task={nope: 4}", "cluster.env.slots_per_task", "unknown field"),
    ("cluster.env.nodes=2", "envs.workers", "every env node runs a worker"),
    ("cluster.hetjob=maybe", "cluster.hetjob", "true/false"),
])
def test_bad_topology_names_the_field(override: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config("smoke", [override])
    assert str(e.value).startswith(f"{field}:") and words in str(e.value)


def test_rollout_gpus_must_match_engines() -> None:
    cfg = load_config("smoke", ["cluster.schedule=async", "cluster.rollout.ranks=4", "cluster.rollout.nodes=2", "cluster.rollout.engines_per_rank=3",
                                "cluster.rollout.lagging_engines_per_rank=1", "cluster.rollout.tensor_parallel_size=2",
                                "cluster.rollout.gpus_per_node=16"])
    assert cfg.cluster.rollout.gpus_per_rank == 8  # (3 + 1) engines x 2 GPUs
    same = ["cluster.schedule=async", "cluster.rollout.ranks=4", "cluster.rollout.nodes=2",
            "cluster.rollout.engines_per_rank=3",
            "cluster.rollout.lagging_engines_per_rank=1", "cluster.rollout.tensor_parallel_size=2"]
    with pytest.raises(ConfigError, match=r"^cluster.rollout.tensor_parallel_size: .* = 8 GPUs per rollout rank, "
                                          r"but a rank has gpus_per_node / \(ranks / nodes\) = 4$"):
        load_config("smoke", [*same, "cluster.rollout.gpus_per_node=8"])
    with pytest.raises(ConfigError, match=r"^cluster.rollout.gpus_per_node: .* = 16 \(no GPU of a rollout node"):
        load_config("smoke", [*same, "cluster.rollout.gpus_per_node=32"])


@pytest.mark.parametrize("size,trainer_gpus,rollout_gpus", [
    ("3b", 8, 8), ("7b", 16, 16), ("14b", 32, 32), ("32b", 64, 32),
])
def test_paper_presets(size: str, trainer_gpus: int, rollout_gpus: int) -> None:
    cfg = load_config(f"agentbench-qwen2.5-{size}")
    c = cfg.cluster
    assert cfg.model.path == f"models/Qwen2.5-{size.upper()}-Instruct"
    assert cfg.envs.tasks == ("os", "db", "kg", "alfworld", "webshop")
    r, a, t = cfg.rollout, cfg.algo, cfg.trainer
    assert (r.group_size, r.temperature, r.max_turns, r.max_model_len) == (8, 0.8, 20, 8192)
    assert (t.lr, a.eps_low, a.eps_high, a.dual_clip, a.kl_coef, a.fail_penalty) == (1e-6, 0.2, 0.2, 3.0, 1e-4, -0.2)
    assert (cfg.rollout.lagging_prob, c.rollout.lagging_refresh_steps) == (0.25, 25)
    assert c.trainer.nodes * c.trainer.gpus_per_node == trainer_gpus
    assert c.rollout.nodes * c.rollout.gpus_per_node == rollout_gpus
    assert c.rollout.engines_per_rank == 3 * c.rollout.lagging_engines_per_rank  # a quarter of the engines lag
    assert c.schedule == "async" and cfg.algo.max_staleness == 1  # the paper's presets run the pipeline
    layout = topology.plan(cfg)
    assert [s.ntasks for s in layout.steps] == [1, cfg.envs.workers, trainer_gpus]  # the pipeline: one MPMD step
    (rollout,) = layout.steps[-1].mpmd
    assert (rollout.module, rollout.ntasks, layout.steps[-1].module) == ("jobs.rollout", c.rollout.ranks,
                                                                       "jobs.trainer")
    assert not layout.needs_model


def test_local_default_is_unchanged() -> None:
    c = load_config("smoke").cluster
    assert (c.launcher, c.hetjob, c.trainer.world_size, c.rollout.ranks, c.env.nodes) == ("local", True, 1, 1, 1)


def test_async_data_parallel_trainer_loads_and_leads_the_local_mpmd_world(tmp_path) -> None:
    """Several trainer ranks on the asynchronous schedule (MPI channel): accepted, and the local launcher's
    world starts them first (world ranks 0..T-1), then the rollout ranks."""
    from agentrl.launch.local import mpmd_command

    cfg = load_config("smoke", ["cluster.schedule=async", "cluster.trainer.ranks_per_node=2", "cluster.rollout.ranks=3"])
    assert cfg.cluster.trainer.world_size == 2
    cmd = mpmd_command("py", tmp_path, cfg.cluster.rollout.ranks, 2, trainer_ranks=cfg.cluster.trainer.world_size)
    trainer, rollout = cmd[:cmd.index(":")], cmd[cmd.index(":") + 1:]
    assert trainer[1:3] == ["-n", "2"] and "jobs.trainer" in trainer
    assert rollout[:2] == ["-n", "3"] and "jobs.rollout" in rollout


def test_choices_and_timeouts_resolve() -> None:
    cfg = load_config("agentbench-qwen2.5-7b", ["cluster.mpi=pmix", "cluster.trainer.slurm.time=00:20:00"])
    assert cfg.cluster.mpi == "pmix" and cfg.cluster.gpu_binding == "gpus-per-task"
    assert cfg.cluster.trainer.collective_timeout == 600.0  # 0: half a limit shorter than an hour
    assert load_config("agentbench-qwen2.5-7b").cluster.trainer.collective_timeout == 1800.0
    with pytest.raises(ConfigError, match=r"^cluster.trainer.slurm.mem_per_gpu: set mem or mem_per_gpu"):
        load_config("agentbench-qwen2.5-7b", ["cluster.trainer.slurm.mem=0", "cluster.trainer.slurm.mem_per_gpu=80G"])


def test_engines_times_tensor_parallel_must_fit_a_rollout_rank() -> None:
    """(1 current + 1 lagging) x TP 4 = 8 GPUs per rank, but 8 GPUs per node hold 2 ranks: 4 each."""
    with pytest.raises(ConfigError) as e:
        load_config("agentbench-qwen2.5-7b", ["cluster.rollout.engines_per_rank=1",
                                              "cluster.rollout.tensor_parallel_size=4"])
    msg = str(e.value)
    assert msg.startswith("cluster.rollout.tensor_parallel_size: (engines_per_rank 1 + lagging_engines_per_rank 1) "
                          "x tensor_parallel_size 4 = 8 GPUs per rollout rank") and msg.endswith("= 4"), msg


def test_the_synchronous_baseline_runs_one_rollout_rank() -> None:
    """N copies of the synchronous rollout role would write the same shards with the same seeds."""
    with pytest.raises(ConfigError, match=r"^cluster.rollout.ranks: the synchronous schedule runs one rollout rank, "
                                          r"not 4; use cluster.schedule=async"):
        load_config("agentbench-qwen2.5-7b", ["cluster.schedule=sync"])
    assert load_config("agentbench-qwen2.5-7b").cluster.schedule == "async"
    assert load_config(None).cluster.schedule == "async"  # the default, as the README says
