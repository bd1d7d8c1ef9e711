"""The asynchronous schedule under a real Slurm (the CI's: three node names on one host), marked `slurm`.

Trainer and rollout ranks are one MPI world started as one MPMD srun step across het groups 0 and 1;
controller and env worker are steps of group 2 (agentrl.launch.topology). Checked:

* through submitit (`submit.submit`, the HetSlurmExecutor): the smoke run with two rollout ranks trains to
  the end, and the trainer's ledger accounts for every trajectory in the shards exactly once (also with
  `transport.channel=files`, where trainer and rollout ranks are separate steps without MPI);
* through the rendered sbatch script: USR1 mid-run → the trainer finishes its step, checkpoints, stops the
  rollout ranks; the script requeues; the run resumes where it stopped and ends with the ledger intact;
* an env worker killed mid-run is started again by the script (cluster.max_restarts) and the run finishes.

The scripted expert plays every episode (`rollout.engine=expert`): no vLLM, so a run takes seconds of RL.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from async_ledger import reconcile, shard_trajectories
from slurm_tools import job_gone, sbatch_script, wait_until

from agentrl.config import load_config
from agentrl.launch import sbatch, topology
from agentrl.transport.shards import ShardReader

pytestmark = [pytest.mark.slurm]
ASYNC = ["cluster.trainer.slurm.cpus_per_task=1", "cluster.rollout.slurm.cpus_per_task=1",
         "cluster.env.slurm.cpus_per_task=1", "trainer.threads=1", "rollout.engine=expert",
         "cluster.trainer.slurm.time=00:10:00", "cluster.rollout.slurm.time=00:10:00",
         "cluster.env.slurm.time=00:10:00", "cluster.schedule=async", "cluster.rollout.ranks=2",
         "cluster.role_timeout_s=300"]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def trained_steps(run_dir: Path) -> list[int]:
    """The step index of every trainer step TensorBoard recorded, over every trainer event file (a restarted
    trainer writes a new one); orphaned events are kept, so a step trained twice shows up twice."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps: list[int] = []
    for events in sorted((run_dir / "tb").glob("events.out.tfevents.*.trainer")):
        acc = EventAccumulator(str(events), purge_orphaned_data=False)
        acc.Reload()
        if "pipeline/batch_size" in acc.Tags()["scalars"]:
            steps += [e.step for e in acc.Scalars("pipeline/batch_size")]
    return sorted(steps)


def taken(trainer: dict) -> int:
    """Trajectories the trainer's steps took from the queue: trained on, or dropped with a counted reason."""
    return int(trainer["trajectories_trained"] + sum(v for k, v in trainer.items() if k.startswith("dropped_")))


@pytest.mark.parametrize("channel", ["mpi", "files"])
def test_async_smoke_run_as_one_hetjob(slurm, job_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       channel: str) -> None:
    """~50-60 s each. The smoke run on the asynchronous schedule through submitit, trained to the end;
    `job.result()` is the summary. mpi: trainer (group 0) and two rollout ranks (group 1) in one MPI world;
    files: the trainer and each rollout rank steps of their own, no MPI."""
    from agentrl.launch import submit

    monkeypatch.chdir(tmp_path)
    overrides = [*ASYNC, f"transport.channel={channel}"]
    cfg = load_config("smoke", overrides)
    (job,) = submit.submit(cfg, "smoke", overrides, tmp_path / "submitit")
    summary = job.result()
    run_dir = tmp_path / "runs" / f"smoke-{job.job_id}"
    assert (run_dir / "report" / "summary.json").exists()
    assert summary["schedule"] == "async" and summary["rl_steps"] == cfg.trainer.steps
    trainer = read_json(run_dir / "report" / "trainer.json")
    assert trainer["schedule"] == "async"
    assert trainer["steps_done"] == trainer["steps"] == cfg.trainer.steps == 2
    # both rollout ranks joined the trainer and were stopped by it
    assert {read_json(run_dir / "report" / f"rollout-{r}.json")["rank"] for r in range(2)} == {0, 1}
    ledger = reconcile(run_dir)
    per_step = cfg.rollout.groups_per_task * cfg.rollout.group_size
    assert len(ledger.consumed) == taken(trainer) == cfg.trainer.steps * per_step  # each once
    # every rank distinct: its own shard directory and its own groups (ids carry the rank), none shared
    by_rank = shard_trajectories(run_dir)
    assert sorted(by_rank) == [0, 1] and all(by_rank.values())
    groups = [{t.group_id for t in ts} for ts in by_rank.values()]
    assert not groups[0] & groups[1]
    assert trainer["left_at_end/held"] == len(ledger.held)
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    if channel == "mpi":
        assert logs == ["controller-0.log", "env_worker-0.log", "pipeline.log"]
        log = (run_dir / "logs" / "pipeline.log").read_text()
        assert "[trainer]" in log and "[rollout-0]" in log and "[rollout-1]" in log
    else:
        assert logs == ["controller-0.log", "env_worker-0.log", "rollout-0.log", "rollout-1.log", "trainer-0.log"]
        assert "[rollout-1]" in (run_dir / "logs" / "rollout-1.log").read_text()


def test_async_two_trainer_ranks_as_one_hetjob(slurm, job_env, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The MPI smoke run with two data-parallel (DDP) trainer ranks in group 0: world ranks 0-1 make their
    process group from MPI under `srun --mpi=pmi2`, the hub alone talks to the rollout ranks (world ranks 2-3)."""
    from agentrl.launch import submit

    monkeypatch.chdir(tmp_path)
    overrides = [*ASYNC, "cluster.trainer.ranks_per_node=2", "trainer.parallel=ddp"]
    cfg = load_config("smoke", overrides)
    (job,) = submit.submit(cfg, "smoke", overrides, tmp_path / "submitit")
    summary = job.result()
    run_dir = tmp_path / "runs" / f"smoke-{job.job_id}"
    assert summary["schedule"] == "async" and summary["rl_steps"] == cfg.trainer.steps
    trainer = read_json(run_dir / "report" / "trainer.json")
    assert trainer["steps_done"] == cfg.trainer.steps == 2
    assert {read_json(run_dir / "report" / f"rollout-{r}.json")["rank"] for r in range(2)} == {0, 1}
    ledger = reconcile(run_dir)
    assert len(ledger.consumed) == taken(trainer) == cfg.trainer.steps * cfg.rollout.groups_per_task * \
        cfg.rollout.group_size
    assert read_json(run_dir / "ckpt" / f"step-{cfg.trainer.steps}" / "trainer.json")["world_size"] == 2
    log = (run_dir / "logs" / "pipeline.log").read_text()
    assert "[trainer]" in log and "[trainer-1]" in log and "[rollout-0]" in log and "[rollout-1]" in log


def test_async_usr1_checkpoints_requeues_and_resumes(slurm, job_env, tmp_path: Path) -> None:
    """~2-3.5 min (cred_expire=10 s before the requeued job may start). The rendered async script gets USR1
    mid-run: the trainer checkpoints after its step and stops the rollout ranks, the script requeues, the
    job resumes in the same run dir: the step counter goes on, nothing consumed before is lost, nothing twice."""
    steps = 12
    overrides = [*ASYNC, f"trainer.steps={steps}", "rollout.env_latency_s=0.2", "rollout.eval_sampled=0"]
    cfg = load_config("smoke", overrides)
    script = sbatch.render_hetjob(topology.plan(cfg), "smoke", overrides)
    job = sbatch_script(script, tmp_path / "async.sbatch")
    run_dir = tmp_path / "runs" / f"smoke-{job}"
    report = run_dir / "report" / "trainer.json"
    job_log = tmp_path / f"agentrl-smoke-{job}.out"

    wait_until(lambda: steps_done(run_dir) >= 2, 240, "no RL steps")
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    wait_until(lambda: job_log.exists() and "requeueing job" in job_log.read_text(), 120, "no requeue")
    # what the preempted trainer left: its ledger and report (the restarted one rewrites them when it ends)
    before = read_json(run_dir / "report" / "ledger.json")
    at_stop = read_json(report)["steps_done"]
    assert 2 <= at_stop < steps, f"the run was not stopped mid-way (step {at_stop} of {steps})"
    wait_until(lambda: job_gone(job), 400, f"job {job} did not finish after the requeue")

    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    log = job_log.read_text()
    assert "JobState=COMPLETED" in state and "Restarts=1" in state, state + log[-3000:]
    pipeline = (run_dir / "logs" / "pipeline.log").read_text()
    assert f"preempted: checkpointed step {at_stop}" in pipeline
    assert f"the trainer stopped at step {at_stop} of {steps}: no final evaluation" in pipeline  # requeue at once
    assert "resumed from" in pipeline
    # the restarted rollout ranks resumed too (main's "Resume:" work): the warm start's demonstrations and the
    # before-RL evaluation were kept, not made again
    assert "expert: demonstrations already written" in pipeline and "before-RL evaluation of v0 read" in pipeline
    assert sum(len(ts) for _, ts in ShardReader(run_dir / "shards" / "expert-0").scan()) == cfg.rollout.expert_samples
    trainer = read_json(report)
    assert trainer["steps_done"] == trainer["steps"] == steps and trainer["policy_version"] == steps
    assert trained_steps(run_dir) == list(range(steps))  # the counter went on; no step trained twice
    assert (run_dir / "report" / "summary.json").exists()
    ledger = reconcile(run_dir)  # every trajectory in the shards once: consumed, excluded or held
    assert set(before["consumed"]) <= ledger.consumed  # nothing consumed before the signal was lost
    assert len(ledger.consumed) == taken(trainer)  # no trajectory consumed in two steps
    assert trainer["queue"]["consumed"] == len(ledger.consumed)
    assert sorted(shard_trajectories(run_dir)) == [0, 1]


def steps_done(run_dir: Path) -> int:
    """The trainer's steps so far, from its report (0 before the first)."""
    try:
        return int(read_json(run_dir / "report" / "trainer.json")["steps_done"])
    except (OSError, ValueError, KeyError):
        return 0


def live_pids(*args: str) -> list[int]:
    """Live (not zombie) python processes whose arguments after the interpreter start with `args` (the
    programs themselves, not the srun steps that name them)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and argv[1:1 + len(args)] == list(args) and state != "Z":
            pids.append(int(entry.name))
    return sorted(pids)


def worker_pids(run: str) -> list[int]:
    """Env worker processes of run dir `run`."""
    return live_pids("-m", "jobs.env_worker", "--run-dir", run)


def test_async_env_worker_killed_is_restarted(slurm, job_env, tmp_path: Path) -> None:
    """~80-125 s. SIGKILL to the env worker mid-run: the rendered script's loop starts its step again (the
    trainer and rollout ranks wait for it meanwhile), and the run finishes with the ledger intact."""
    steps = 6
    overrides = [*ASYNC, f"trainer.steps={steps}", "rollout.env_latency_s=0.2", "rollout.eval_sampled=0",
                 "cluster.max_restarts=1"]
    cfg = load_config("smoke", overrides)
    job = sbatch_script(sbatch.render_hetjob(topology.plan(cfg), "smoke", overrides), tmp_path / "async.sbatch")
    run_dir = tmp_path / "runs" / f"smoke-{job}"

    try:
        wait_until(lambda: steps_done(run_dir) >= 1, 240, "no RL steps")
        (pid,) = wait_until(lambda: worker_pids(str(run_dir)), 10, "no env worker process")
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        wait_until(lambda: [p for p in worker_pids(str(run_dir)) if p != pid], 60,
                   "the env worker was not started again")
        restart_s = time.monotonic() - t_kill
        wait_until(lambda: job_gone(job), 300, f"job {job} did not finish")
    finally:
        subprocess.run(["scancel", job], check=False)  # a failed test leaves no job behind
    log = (tmp_path / f"agentrl-smoke-{job}.out").read_text()
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in state, state + log[-3000:]
    assert "env_worker 0 exited with" in log and "(0 restarts left)" in log
    worker_log = (run_dir / "logs" / "env_worker-0.log").read_text()
    assert worker_log.count("worker worker-0 serving") == 2, worker_log[-2000:]  # both lives logged to the one file
    trainer = read_json(run_dir / "report" / "trainer.json")
    assert trainer["steps_done"] == steps and trained_steps(run_dir) == list(range(steps))
    reconcile(run_dir)
    print(f"env worker started again {restart_s:.1f}s after the kill")


def rollout_pids(run: str) -> list[int]:
    """Rollout rank processes (`python -m mpi4py -m jobs.rollout --run-dir run`) of run dir `run`."""
    return live_pids("-m", "mpi4py", "-m", "jobs.rollout", "--run-dir", run)


def test_async_rollout_rank_killed_restarts_the_pipeline(slurm, job_env, tmp_path: Path) -> None:
    """SIGKILL to one rollout rank mid-run (after two trainer steps): the MPMD step ends, the rendered script
    clears the pipeline's rendezvous keys and starts the step again (cluster.max_restarts); the trainer
    resumes from its newest checkpoint, trains to the end, and no trajectory is consumed twice."""
    steps = 6
    overrides = [*ASYNC, f"trainer.steps={steps}", "trainer.checkpoint_every=1", "rollout.env_latency_s=0.2",
                 "rollout.eval_sampled=0", "cluster.max_restarts=1"]
    cfg = load_config("smoke", overrides)
    job = sbatch_script(sbatch.render_hetjob(topology.plan(cfg), "smoke", overrides), tmp_path / "async.sbatch")
    run_dir = tmp_path / "runs" / f"smoke-{job}"
    job_log = tmp_path / f"agentrl-smoke-{job}.out"

    try:
        wait_until(lambda: steps_done(run_dir) >= 2, 240, "no RL steps")
        at_kill = steps_done(run_dir)
        pids = wait_until(lambda: rollout_pids(str(run_dir)), 10, "no rollout rank process")
        assert len(pids) == 2, pids
        os.kill(pids[1], signal.SIGKILL)
        t_kill = time.monotonic()
        wait_until(lambda: job_log.exists() and "starting it again" in job_log.read_text(), 120,
                   "the pipeline was not started again")
        restart_s = time.monotonic() - t_kill
        wait_until(lambda: job_gone(job), 300, f"job {job} did not finish")
    finally:
        subprocess.run(["scancel", job], check=False)  # a failed test leaves no job behind
    log = job_log.read_text()
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state + log[-3000:]
    assert "Restarts=0" in state  # restarted in place, not requeued
    assert log.count("agentrl: the pipeline (trainer and rollout ranks, one MPI world) exited with") == 1, log
    assert "starting it again (0 restarts left)" in log and "requeueing" not in log
    # before the restart (in this MPMD world with the weights directory the trainer publishes none of them)
    assert f"agentrl: cleared the pipeline's rendezvous keys in {run_dir}:" in log
    pipeline = (run_dir / "logs" / "pipeline.log").read_text()
    assert "resumed from" in pipeline, pipeline[-3000:]
    trainer = read_json(run_dir / "report" / "trainer.json")
    assert trainer["steps_done"] == trainer["steps"] == steps and trainer["policy_version"] == steps
    trained = trained_steps(run_dir)
    assert sorted(set(trained)) == list(range(steps))  # every step trained; one after the checkpoint maybe twice
    assert len(trained) - steps <= 1, trained
    assert (run_dir / "report" / "summary.json").exists()
    ledger = reconcile(run_dir)  # every trajectory in the shards once: consumed, excluded or held
    assert len(ledger.consumed) == taken(trainer)  # no trajectory consumed in two steps
    assert trainer["queue"]["consumed"] == len(ledger.consumed)
    for r in range(2):  # both ranks started a second incarnation
        assert (run_dir / "shards" / f"rollout-{r}" / "incarnation").read_text() == "1"
    print(f"rollout rank killed after step {at_kill}; the pipeline started again {restart_s:.1f}s after the kill")
