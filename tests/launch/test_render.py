"""Golden files of what `python -m jobs.launch --render-sbatch` prints (`agentrl.launch.sbatch.render_run`), and
of the Apptainer command lines.

A change to the rendering shows up as a diff here. After a deliberate change, regenerate and read the diff:
    AGENTRL_REGEN_GOLDEN=1 python -m pytest tests/launch/test_render.py
The committed scripts in sbatch/ must be exactly what the renderer prints for them (so they stay in step).
Goldens are rendered with `--root /srv/agentrl` (a checkout's path on a site's compute nodes), the committed
scripts with `--root '$SLURM_SUBMIT_DIR'` (submitted from the repository root, as the CI's Slurm tests do).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.launch.sbatch import render_run

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("AGENTRL_REGEN_GOLDEN") == "1"
SMALL = ["cluster.trainer.slurm.cpus_per_task=1", "cluster.rollout.slurm.cpus_per_task=1",
         "cluster.env.slurm.cpus_per_task=1", "trainer.threads=1", "rollout.engine=expert"]

SITE = ["cluster.trainer.slurm.partition=gpu", "cluster.rollout.slurm.partition=gpu",
        "cluster.env.slurm.partition=cpu", "cluster.trainer.slurm.account=proj42", "cluster.rollout.slurm.account=proj42",
        "cluster.env.slurm.account=proj42", "cluster.trainer.gpus_per_node=4", "cluster.trainer.ranks_per_node=4",
        "cluster.trainer.nodes=4", "cluster.rollout.gpus_per_node=4", "cluster.rollout.ranks=4",
        "cluster.rollout.nodes=4", "cluster.mpi=pmix", "cluster.python=python",
        "cluster.setup=[module load cuda/12.4, source /srv/venvs/agentrl/bin/activate]",
        "model.path=/scratch/proj42/models/Qwen2.5-7B-Instruct"]
CASES = {  # golden file: (preset, overrides)
    "smoke-hetjob.sbatch": ("smoke", SMALL),
    "smoke-per-role.sh": ("smoke", [*SMALL, "cluster.hetjob=false", "transport.channel=files"]),
    "smoke-async-hetjob.sbatch": ("smoke", [*SMALL, "cluster.schedule=async", "cluster.rollout.ranks=2"]),
    "smoke-async-files-hetjob.sbatch": ("smoke", [*SMALL, "cluster.schedule=async", "cluster.rollout.ranks=2",
                                                  "transport.channel=files"]),
    "agentbench-qwen2.5-7b-async.sbatch": ("agentbench-qwen2.5-7b", [
        "cluster.schedule=async", "cluster.trainer.nodes=1", "cluster.trainer.gpus_per_node=1",
        "cluster.trainer.ranks_per_node=1"]),
    "demo-controller-with-trainer.sbatch": ("demo", ["cluster.controller_placement=trainer", "envs.workers=2"]),
    "agentbench-qwen2.5-3b.sbatch": ("agentbench-qwen2.5-3b", []),
    "agentbench-qwen2.5-7b.sbatch": ("agentbench-qwen2.5-7b", []),
    "agentbench-qwen2.5-14b.sbatch": ("agentbench-qwen2.5-14b", []),
    "agentbench-qwen2.5-32b.sbatch": ("agentbench-qwen2.5-32b", []),
    "agentbench-qwen2.5-7b-per-role.sh": ("agentbench-qwen2.5-7b", ["cluster.schedule=sync", "cluster.rollout.ranks=1", "cluster.rollout.nodes=1", "cluster.rollout.gpus_per_node=4", "cluster.hetjob=false", "transport.channel=files"]),
    "smoke-apptainer-workers.sbatch": ("smoke", ["cluster.env.apptainer_image=/images/agentrl.sif",
                                                 "cluster.env.binds=[/scratch/agentbench]"]),
    # a site's adaptation of the 7B preset (docs/slurm.md walks through it)
    "agentbench-qwen2.5-7b-site.sbatch": ("agentbench-qwen2.5-7b", SITE),
    "agentbench-qwen2.5-7b-gres-pmix.sbatch": ("agentbench-qwen2.5-7b", [
        "cluster.schedule=async", "cluster.gpu_binding=gres", "cluster.mpi=pmix", "cluster.trainer.nodes=1",
        "cluster.trainer.slurm.mem=", "cluster.trainer.slurm.mem_per_gpu=200G", "cluster.setup=[module load openmpi]"]),
    "smoke-setup-per-role.sh": ("smoke", [*SMALL, "cluster.hetjob=false", "transport.channel=files",
                                          "cluster.setup=[module load python/3.11]"]),
}
COMMITTED = {  # sbatch/ file: (preset, overrides)
    "smoke.sbatch": ("smoke", SMALL),
    "smoke-async.sbatch": ("smoke", [*SMALL, "cluster.schedule=async", "cluster.rollout.ranks=2"]),
    "agentbench-qwen2.5-7b.sbatch": ("agentbench-qwen2.5-7b", []),
    "agentbench-qwen2.5-7b-per-role.sh": ("agentbench-qwen2.5-7b", ["cluster.schedule=sync", "cluster.rollout.ranks=1", "cluster.rollout.nodes=1", "cluster.rollout.gpus_per_node=4", "cluster.hetjob=false", "transport.channel=files"]),
}


def render(preset: str, overrides: list[str], root: str = "/srv/agentrl") -> str:
    """What `jobs.launch --preset PRESET --render-sbatch --root ROOT OVERRIDES...` prints."""
    return render_run(load_config(preset, overrides), preset, overrides, root)


def check(path: Path, text: str) -> None:
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with AGENTRL_REGEN_GOLDEN=1 to write it"
    assert text == path.read_text(), f"{path.name} differs from the rendering (AGENTRL_REGEN_GOLDEN=1 rewrites it)"


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    preset, overrides = CASES[name]
    text = render(preset, overrides)
    check(GOLDEN / name, text)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0, "not valid bash"


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_committed_scripts_are_rendered(name: str) -> None:
    preset, overrides = COMMITTED[name]
    check(ROOT / "sbatch" / name, render(preset, overrides, root="$SLURM_SUBMIT_DIR"))


def test_hetjob_groups_and_steps() -> None:
    text = render("agentbench-qwen2.5-32b", [])
    blocks = text.split("#SBATCH hetjob\n")
    assert len(blocks) == 3
    trainer, rollout, env = blocks
    assert "#SBATCH --nodes=8\n#SBATCH --ntasks-per-node=8\n#SBATCH --cpus-per-task=8\n#SBATCH --gpus-per-node=8" in trainer
    assert "#SBATCH --nodes=4\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=16\n#SBATCH --gpus-per-node=8" in rollout
    assert "#SBATCH --ntasks=6\n" in env  # 5 workers + the controller
    assert "#SBATCH --signal=B:USR1@600" in trainer
    steps = [shlex.split(line.strip()) for line in text.splitlines() if line.strip().startswith("srun --mpi=")]
    assert [(s[2], s[3]) for s in steps] == [("--het-group=2", "--ntasks=1"), ("--het-group=2", "--ntasks=1"),
                                            ("--het-group=0", "--ntasks=64")]
    assert "\nenv_workers 5 &\n" in text  # five env workers, each its own step (restarted when it fails)
    assert [s[s.index("--") + 3] for s in steps[:2]] == ["jobs.controller", "jobs.env_worker"]
    # the asynchronous pipeline (the presets' schedule): one MPMD step, trainer ranks then rollout ranks
    trainer, rollout = (shlex.split(part) for part in text.split("srun --mpi=pmi2 ", 1)[1].split("&\n", 1)[0]
                        .split(" : "))
    assert trainer[:2] == ["--het-group=0", "--ntasks=64"] and rollout[:2] == ["--het-group=1", "--ntasks=4"]
    assert trainer[trainer.index("-m", trainer.index("mpi4py")) + 1] == "jobs.trainer"
    assert rollout[rollout.index("-m", rollout.index("mpi4py")) + 1] == "jobs.rollout"
    assert "--gpus-per-task=8" in rollout and "--gpu-bind=per_task:8" in rollout  # a rollout rank: its engines' GPUs
    assert "--gpus-per-task=1" in trainer and "--gpu-bind=per_task:1" in trainer  # a trainer rank: its own GPU
    assert [s[1] for s in steps[:2]] == ["--mpi=none"] * 2  # the controller and env workers run no MPI
    assert "--cpus-per-task=16" in rollout and "--cpus-per-task=8" in trainer and "--mem=0" in rollout
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in trainer and "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" not in rollout
    assert "controller.host=0.0.0.0" in text


def test_async_trainer_and_rollout_are_one_mpmd_step() -> None:
    text = render("smoke", ["cluster.schedule=async", "cluster.rollout.ranks=3", "cluster.rollout.nodes=1",
                            "cluster.engine_threads=4"])
    steps = [shlex.split(line.strip()) for line in text.splitlines() if line.strip().startswith("srun --mpi=")]
    assert len(steps) == 3  # controller, env workers, and trainer + rollout ranks as one step
    mpmd = steps[2]
    trainer, rollout = mpmd[:mpmd.index(":")], mpmd[mpmd.index(":") + 1:]
    assert mpmd[1] == "--mpi=pmi2"  # cluster.mpi's default, for the MPI world
    assert trainer[2:7] == ["--het-group=0", "--ntasks=1", "--exact", "--cpus-per-task=2", "--mem=0"]
    assert trainer[7:] == ["--output=$RUN_DIR/logs/pipeline.log",  # one log for the MPI world's ranks
                           "--kill-on-bad-exit=1",  # a dead rank ends the world (else the others wait on it)
                           "$PY", "-m", "mpi4py", "-m", "jobs.trainer", "--run-dir", "$RUN_DIR"]
    assert rollout[:6] == ["--het-group=1", "--ntasks=3", "--exact", "--cpus-per-task=2", "--mem=0",
                           "--kill-on-bad-exit=1"]
    assert rollout[6:8] == ["env", "OMP_NUM_THREADS=4"]  # srun would start the engine ranks with the step's CPUs
    assert rollout[8:] == ["$PY", "-m", "mpi4py", "-m", "jobs.rollout", "--run-dir", "$RUN_DIR", "&"]
    assert "agentrl.launch.slurm_env" not in mpmd  # MPI gives these ranks their places
    # USR1 goes to the MPMD step, started (and, when it fails, started again) by `pipeline`
    assert text.count("TRAINER=$!") == 1 and "\npipeline() {\n  srun --mpi=pmi2 --het-group=0 " in text
    # no role runs outside the MPI world (as the file channel's steps do, without mpi4py)
    assert "ROLLOUT=$!" not in text and '"$PY" -m jobs.trainer' not in text and '"$PY" -m jobs.rollout' not in text
    assert '    wait_step "$TRAINER"; rc=$?' in text and "\nwait_pipeline || status=$?\n" in text
    assert "  local left=3 rc\n" in text  # cluster.max_restarts' default bounds the restarts


def test_async_file_channel_runs_every_rank_as_its_own_restartable_step() -> None:
    text = render("smoke", ["cluster.schedule=async", "transport.channel=files", "cluster.rollout.ranks=3",
                            "cluster.rollout.nodes=1", "cluster.max_restarts=2"])
    assert "mpi4py" not in text and " : " not in text  # no MPI world
    steps = [shlex.split(line.strip()) for line in text.splitlines() if line.strip().startswith("srun --mpi=")]
    rollout = next(s for s in steps if "jobs.rollout" in s)
    assert rollout[2:8] == ["--het-group=1", "--ntasks=1", "--exact", "--cpus-per-task=2", "--mem=0",
                            "--output=$RUN_DIR/logs/rollout-$1.log"]
    assert rollout[-5:] == ["--run-dir", "$RUN_DIR", "--rank", "$1", "&"] and "OMP_NUM_THREADS=2" in rollout
    trainer = next(s for s in steps if "jobs.trainer" in s)
    assert trainer[2:4] == ["--het-group=0", "--ntasks=1"]
    assert "\nrollouts 3 &\nROLLOUT=$!" in text and "  local left=2 rc step" in text
    assert 'wait_step "$TRAINER"' in text and 'wait_step "$ROLLOUT"' in text  # rank 0 writes the summary last


def test_async_data_parallel_trainer_ranks_lead_the_mpmd_step() -> None:
    text = render("smoke", ["cluster.schedule=async", "cluster.trainer.nodes=2", "cluster.trainer.ranks_per_node=2",
                            "cluster.rollout.ranks=3", "cluster.rollout.nodes=1"])
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n" in text.split("#SBATCH hetjob\n")[0]
    steps = [shlex.split(line.strip()) for line in text.splitlines() if line.strip().startswith("srun --mpi=")]
    mpmd = steps[2]
    trainer, rollout = mpmd[:mpmd.index(":")], mpmd[mpmd.index(":") + 1:]
    assert trainer[2:4] == ["--het-group=0", "--ntasks=4"]  # world ranks 0..3; rollout ranks follow from 4
    assert rollout[:2] == ["--het-group=1", "--ntasks=3"] and "jobs.trainer" in trainer


@pytest.mark.parametrize("overrides, field", [
    (["cluster.hetjob=false"], "cluster.hetjob: false (one job per role) needs transport.channel=files"),
    (["cluster.trainer.ranks_per_node=2", "trainer.parallel=none"], "trainer.parallel: must be ddp or fsdp2"),
])
def test_jobs_per_role_need_the_file_channel_and_trainer_ranks_a_parallel_layout(overrides: list[str],
                                                                                   field: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config("smoke", ["cluster.schedule=async", *overrides])
    assert field in str(e.value)


def test_per_role_jobs_are_chained() -> None:
    text = render("smoke", ["cluster.hetjob=false", "transport.channel=files"])
    assert "#SBATCH hetjob" not in text and "--het-group" not in text
    assert "ENV_JOB=$(sbatch --parsable <<'JOB'" in text
    assert "TRAINER_JOB=$(sbatch --parsable --dependency=after:$ENV_JOB <<'JOB'" in text
    assert "ROLLOUT_JOB=$(sbatch --parsable --dependency=after:$TRAINER_JOB <<'JOB'" in text


def test_render_rejects_bad_topology() -> None:
    with pytest.raises(ConfigError, match=r"cluster.rollout.ranks: must be a multiple of nodes \(2\)"):
        load_config("agentbench-qwen2.5-7b", ["cluster.rollout.ranks=3"])


def test_render_runs_without_torch() -> None:
    """Login nodes have no torch: the command's rendering must not import it (nor vLLM, nor mpi4py); its config
    errors exit 2 with the field named."""
    code = ("import sys, runpy; sys.argv=['jobs.launch','--preset','smoke','--render-sbatch'];"
            "rc = 0\ntry: runpy.run_module('jobs.launch', run_name='__main__', alter_sys=True)\n"
            "except SystemExit as e: rc = e.code\n"
            "bad=[m for m in ('torch','vllm','mpi4py','submitit') if m in sys.modules]; assert not bad, bad;"
            "assert rc == 0, rc")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("#!/bin/bash")
    bad = subprocess.run([sys.executable, "-m", "jobs.launch", "--preset", "agentbench-qwen2.5-7b", "--render-sbatch",
                          "cluster.rollout.ranks=3"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bad.returncode == 2 and "cluster.rollout.ranks: must be a multiple of nodes (2)" in bad.stderr


def test_gres_binding_masks_rollout_ranks_and_leaves_trainer_ranks_their_node() -> None:
    text = render("agentbench-qwen2.5-7b", ["cluster.gpu_binding=gres"])
    assert text.count("#SBATCH --gres=gpu:8\n") == 2 and "--gpus-per-node" not in text
    trainer, rollout = (shlex.split(part) for part in text.split("srun --mpi=pmi2 ", 1)[1].split("&\n", 1)[0]
                        .split(" : "))
    assert rollout[rollout.index("--gres=gpu:8") + 1] == "--gpu-bind=mask_gpu:0xf,0xf0"  # 2 ranks x 4 GPUs a node
    assert "--gres=gpu:8" in trainer and not any("gpu-bind" in a for a in trainer)


def test_setup_runs_on_the_node_outside_the_workers_container_and_paths_are_absolute() -> None:
    text = render("smoke", ["cluster.env.apptainer_image=images/agentrl.sif", "cluster.setup=[module load apptainer]",
                            "cluster.env.binds=[data/agentbench, /abs]"], root="/site/repo")
    worker = next(shlex.split(line) for line in text.splitlines() if "jobs.env_worker" in line and "srun" in line)
    at = worker.index("bash")
    assert worker[at:at + 4] == ["bash", "$RUN_DIR/setup.sh", "apptainer", "exec"]
    assert worker[worker.index("--cleanenv") + 1:worker.index("/site/repo/images/agentrl.sif")] == [
        "--bind", "$RUN_DIR", "--bind", "/site/repo/data", "--bind", "/site/repo/data/agentbench", "--bind", "/abs"]
    assert "\ncd /site/repo\n# site set-up" in text and "\nset +u\nmodule load apptainer\nset -u\n" in text
    assert "PY=${AGENTRL_PYTHON:-/site/repo/.venv/bin/python}\nRUN_DIR=/site/repo/runs/smoke-" in text
    assert ("cluster.env.apptainer_image=/site/repo/images/agentrl.sif "
            "'cluster.env.binds=[/site/repo/data/agentbench,/abs]'") in text  # into the run's config.yaml
