#!/bin/bash
# agentrl run 'agentbench-qwen2.5-7b' from preset 'agentbench-qwen2.5-7b': one job per role (cluster.hetjob=false).
# Rendered by `python -m jobs.launch --preset agentbench-qwen2.5-7b --render-sbatch cluster.schedule=sync cluster.rollout.ranks=1 cluster.rollout.nodes=1 cluster.rollout.gpus_per_node=4 cluster.hetjob=false transport.channel=files`; edit the config, not this file.
# Run it (do not sbatch it), after `bash install.sh` in /srv/agentrl (where it runs): it submits the
# jobs. Logs: <job name>-<job id>.out here; each role's in the run dir's logs/<role>-<task>.log.
# Preemption: 600 s before the time limit Slurm sends USR1; the trainer checkpoints and the
# job requeues under the same id, so the run resumes in the same run directory.
set -euo pipefail
cd /srv/agentrl
PY=${AGENTRL_PYTHON:-/srv/agentrl/.venv/bin/python}
RUN_DIR=/srv/agentrl/runs/agentbench-qwen2.5-7b-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN_DIR/logs"
# config.yaml is written once: a requeued job keeps it (and its checkpoints) and resumes
"$PY" -m jobs.launch --preset agentbench-qwen2.5-7b --prepare-run "$RUN_DIR" cluster.schedule=sync cluster.rollout.ranks=1 cluster.rollout.nodes=1 cluster.rollout.gpus_per_node=4 cluster.hetjob=false transport.channel=files controller.host=0.0.0.0 model.path=/srv/agentrl/models/Qwen2.5-7B-Instruct cluster.env.os_sandbox_image=/srv/agentrl/images/os-sandbox.sif
export AGENTRL_RUN_DIR=$RUN_DIR AGENTRL_PYTHON=$PY
ENV_JOB=$(sbatch --parsable <<'JOB'
#!/bin/bash
#SBATCH --job-name=agentrl-agentbench-qwen2.5-7b-env
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --time=1-12:00:00
#SBATCH --nodes=1
#SBATCH --ntasks=6
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
set -u
cd /srv/agentrl
PY=$AGENTRL_PYTHON RUN_DIR=$AGENTRL_RUN_DIR
# wait for a step; a trapped signal interrupts `wait`, so wait again while the step lives
wait_step() {
  local rc
  while :; do
    wait "$1"; rc=$?
    if [ "$rc" -gt 128 ] && kill -0 "$1" 2>/dev/null; then continue; fi
    return "$rc"
  done
}
# controller: 1 task
srun --mpi=none --ntasks=1 --exact --cpus-per-task=8 --mem=0 "--output=$RUN_DIR/logs/controller-%t.log" "$PY" -m agentrl.launch.slurm_env -- "$PY" -m jobs.controller --run-dir "$RUN_DIR" &
CONTROLLER=$!
# env_worker: task $1 as its own step; when it fails it is started again, at most 3 times (meanwhile
# the run goes on without it); SIGTERM stops it and its step
env_worker() {
  local left=3 rc step
  trap 'kill "$step" 2>/dev/null; wait "$step"; exit 0' TERM
  while :; do
    srun --mpi=none --ntasks=1 --exact --cpus-per-task=8 --mem=0 "--output=$RUN_DIR/logs/env_worker-$1.log" "$PY" -m agentrl.launch.slurm_env -- "$PY" -m jobs.env_worker --run-dir "$RUN_DIR" --worker-id "worker-$1" &
    step=$!
    wait "$step"; rc=$?
    [ "$rc" != 0 ] && [ "$left" -gt 0 ] || return "$rc"
    left=$((left - 1))
    echo "agentrl: env_worker $1 exited with $rc; starting it again ($left restarts left)"
  done
}
# env_workers N: tasks 0..N-1, each under env_worker; SIGTERM stops them all. Exit status: the last failure's
env_workers() {
  local pids=() i rc=0
  trap 'kill "${pids[@]}" 2>/dev/null; wait; exit 0' TERM
  for ((i = 0; i < $1; i++)); do env_worker "$i" & pids+=($!); done
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  return "$rc"
}
# env_worker: 5 tasks, a step each
env_workers 5 &
ENV_WORKER=$!
wait_step "$ENV_WORKER"
JOB
)
export AGENTRL_ENV_JOB=$ENV_JOB
TRAINER_JOB=$(sbatch --parsable --dependency=after:$ENV_JOB <<'JOB'
#!/bin/bash
#SBATCH --job-name=agentrl-agentbench-qwen2.5-7b-trainer
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@600
#SBATCH --time=1-12:00:00
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --gpus-per-node=8
#SBATCH --mem=0
set -u
cd /srv/agentrl
PY=$AGENTRL_PYTHON RUN_DIR=$AGENTRL_RUN_DIR
# wait for a step; a trapped signal interrupts `wait`, so wait again while the step lives
wait_step() {
  local rc
  while :; do
    wait "$1"; rc=$?
    if [ "$rc" -gt 128 ] && kill -0 "$1" 2>/dev/null; then continue; fi
    return "$rc"
  done
}
# USR1 (sbatch --signal=B:USR1@<s>, or `scancel --batch --signal=USR1`):
# the trainer checkpoints, then the job requeues
preempted=0
on_usr1() {
  preempted=1
  echo "agentrl: USR1, asking the trainer to checkpoint"
  kill -USR1 "$TRAINER" 2>/dev/null || true
}
trap on_usr1 USR1
export AGENTRL_REQUEUE_BY_SCRIPT=1
# trainer: 16 tasks
srun --mpi=none --ntasks=16 --exact --cpus-per-task=8 --mem=0 "--output=$RUN_DIR/logs/trainer-%t.log" --gpus-per-task=1 --gpu-bind=per_task:1 env TORCH_NCCL_ASYNC_ERROR_HANDLING=1 "$PY" -m agentrl.launch.slurm_env -- "$PY" -m jobs.trainer --run-dir "$RUN_DIR" &
TRAINER=$!
status=0
wait_step "$TRAINER" || status=$?
if [ "$preempted" = 1 ]; then
  echo "agentrl: requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
trap '' USR1  # the trainer is done: a late warning changes nothing
exit "$status"
JOB
)
ROLLOUT_JOB=$(sbatch --parsable --dependency=after:$TRAINER_JOB <<'JOB'
#!/bin/bash
#SBATCH --job-name=agentrl-agentbench-qwen2.5-7b-rollout
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --time=1-12:00:00
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=16
#SBATCH --gpus-per-node=4
#SBATCH --mem=0
set -u
cd /srv/agentrl
PY=$AGENTRL_PYTHON RUN_DIR=$AGENTRL_RUN_DIR
# wait for a step; a trapped signal interrupts `wait`, so wait again while the step lives
wait_step() {
  local rc
  while :; do
    wait "$1"; rc=$?
    if [ "$rc" -gt 128 ] && kill -0 "$1" 2>/dev/null; then continue; fi
    return "$rc"
  done
}
# rollout: task $1 as its own step; when it fails it is started again, at most 3 times (meanwhile
# the run goes on without it); SIGTERM stops it and its step
rollout() {
  local left=3 rc step
  trap 'kill "$step" 2>/dev/null; wait "$step"; exit 0' TERM
  while :; do
    srun --mpi=none --ntasks=1 --exact --cpus-per-task=16 --mem=0 "--output=$RUN_DIR/logs/rollout-$1.log" --gpus-per-task=4 --gpu-bind=per_task:4 env OMP_NUM_THREADS=2 "$PY" -m agentrl.launch.slurm_env -- "$PY" -m jobs.rollout --run-dir "$RUN_DIR" --rank "$1" &
    step=$!
    wait "$step"; rc=$?
    [ "$rc" != 0 ] && [ "$left" -gt 0 ] || return "$rc"
    left=$((left - 1))
    echo "agentrl: rollout $1 exited with $rc; starting it again ($left restarts left)"
  done
}
# rollouts N: tasks 0..N-1, each under rollout; SIGTERM stops them all. Exit status: the last failure's
rollouts() {
  local pids=() i rc=0
  trap 'kill "${pids[@]}" 2>/dev/null; wait; exit 0' TERM
  for ((i = 0; i < $1; i++)); do rollout "$i" & pids+=($!); done
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  return "$rc"
}
# rollout: 1 task, a step each
rollouts 1 &
ROLLOUT=$!
wait_step "$ROLLOUT"; status=$?
scancel "$AGENTRL_ENV_JOB"
exit "$status"
JOB
)
echo "submitted: env $ENV_JOB, trainer $TRAINER_JOB, rollout $ROLLOUT_JOB; run dir $RUN_DIR"
