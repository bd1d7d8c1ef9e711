"""agentrl.launch.slurm_env over Slurm variables captured from real steps of a 2-group hetjob on the CI
cluster (group 0: 1 task on n1, group 1: 2 tasks on n2; job 4, its group 1 is job 5), plus hand cases."""
from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.launch import slurm_env

DATA = Path(__file__).parent / "data"


def captured(name: str) -> dict[str, str]:
    lines = (DATA / f"{name}.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_outside_slurm_is_none():
    assert slurm_env.read({"HOME": "/root"}) is None
    assert not slurm_env.in_slurm({})


def test_mpmd_step_group0_rank0():
    place = slurm_env.read(captured("hetjob_mpmd_group0_rank0"))
    assert place is not None
    assert (place.het_group, place.het_size, place.rank, place.world_size) == (0, 2, 0, 1)
    assert (place.mpi_rank, place.mpi_size) == (0, 3)
    assert place.master_addr == "n1" and place.job_id == "4"


def test_mpmd_step_group1_rank2_is_rank1_of_its_role():
    place = slurm_env.read(captured("hetjob_mpmd_group1_rank2"))
    assert place is not None
    assert (place.het_group, place.rank, place.world_size, place.local_rank) == (1, 1, 2, 1)
    assert (place.mpi_rank, place.mpi_size) == (2, 3)
    assert place.master_addr == "n2"
    assert place.master_port == slurm_env.master_port("4", 1) == 20000 + 4 * 3 + 1


def test_single_group_step_found_by_node_list():
    env = captured("hetjob_group1_only_rank1")
    assert "PMI_RANK" not in env
    place = slurm_env.read(env)
    assert place is not None
    assert (place.het_group, place.rank, place.world_size, place.mpi_rank, place.mpi_size) == (1, 1, 2, 1, 2)


def test_explicit_het_group_wins_and_torch_env():
    env = captured("hetjob_group1_only_rank1") | {"AGENTRL_HET_GROUP": "1", "MASTER_PORT": "29500",
                                                  "SLURM_RESTART_COUNT": "2"}
    place = slurm_env.read(env)
    assert place is not None and place.restart_count == 2
    assert place.torch_env() == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "n2",
                                 "MASTER_PORT": "29500", "AGENTRL_HET_GROUP": "1"}


def test_plain_job_uses_step_nodes():
    env = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
           "SLURM_STEP_NODELIST": "gpu[007-008]", "SLURM_JOB_NODELIST": "gpu[007-009]"}
    place = slurm_env.read(env)
    assert place is not None
    assert (place.het_group, place.rank, place.world_size, place.master_addr) == (None, 3, 4, "gpu007")
    assert "AGENTRL_HET_GROUP" not in place.torch_env()


def test_ambiguous_group_names_the_fix():
    env = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_HET_SIZE": "2",
           "SLURM_NTASKS_HET_GROUP_0": "1", "SLURM_NTASKS_HET_GROUP_1": "1", "SLURM_JOB_NODELIST": "a1",
           "SLURM_JOB_NODELIST_HET_GROUP_0": "a1", "SLURM_JOB_NODELIST_HET_GROUP_1": "a1"}
    with pytest.raises(RuntimeError, match="AGENTRL_HET_GROUP"):
        slurm_env.read(env)


@pytest.mark.parametrize("text,hosts", [
    ("n1", ["n1"]),
    ("n[1-2]", ["n1", "n2"]),
    ("gpu[007-009,012],login1", ["gpu007", "gpu008", "gpu009", "gpu012", "login1"]),
    ("a[1,3],b[10-11]", ["a1", "a3", "b10", "b11"]),
])
def test_expand_hostlist(text, hosts):
    assert slurm_env.expand_hostlist(text) == hosts


def test_job_id_for_requeue():
    assert slurm_env.job_id({"SLURM_JOB_ID": "12"}) == "12"
    assert slurm_env.job_id({"SLURM_JOB_ID": "13", "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "3"}) == "10_3"
    assert slurm_env.job_id({}) is None
