"""Render a run's `topology.JobLayout` as sbatch scripts a person can read and submit by hand.

* `render_hetjob`: one heterogeneous job, one `#SBATCH hetjob` block per group, one
  `srun --mpi=none --het-group=N` step per role (trainer and rollout ranks
  share one MPMD step, `srun ... --het-group=0 A : --het-group=1 B`: one MPI world).
* `render_per_role`: for sites that forbid hetjobs, one bash file that submits one job per role (env →
  trainer → rollout), each started after the one before it with `--dependency=after:`.
* `render_run`: a config's script, the one `jobs.launch --render-sbatch` prints (`cluster.hetjob` picks).

Both write logs where Slurm can (the submit directory, `%x-%j.out`; each role's under the run dir,
which the script creates), and both pass the job's preemption warning (USR1) to the trainer and
requeue. The job runs in the layout's root (the repository on the compute nodes), after the site's set-up
lines (`cluster.setup`), which every step also runs on its own node through RUN_DIR/setup.sh before its
program. What they render is golden-tested (tests/launch/golden/). Standard library only.
"""
from __future__ import annotations

import shlex
from dataclasses import replace

from agentrl.config import RunConfig
from agentrl.launch import topology
from agentrl.launch.apptainer import worker_command
from agentrl.launch.topology import ENV, GROUP_NAMES, ROLLOUT, TRAINER, JobLayout, Step, absolute

SUBMIT_DIR = "$SLURM_SUBMIT_DIR"

_WAIT_STEP = r"""# wait for a step; a trapped signal interrupts `wait`, so wait again while the step lives
wait_step() {
  local rc
  while :; do
    wait "$1"; rc=$?
    if [ "$rc" -gt 128 ] && kill -0 "$1" 2>/dev/null; then continue; fi
    return "$rc"
  done
}"""
_TRAP_USR1 = r"""# USR1 (sbatch --signal=B:USR1@<s>, or `scancel --batch --signal=USR1`):
# the trainer checkpoints, then the job requeues
preempted=0
on_usr1() {
  preempted=1
  echo "agentrl: USR1, asking the trainer to checkpoint"
  kill -USR1 "$TRAINER" 2>/dev/null || true
}
trap on_usr1 USR1"""


def _q(arg: str) -> str:
    """Shell-quote, but leave "$VAR" references expandable (only our own arguments hold a `$`)."""
    if "$" in arg:
        return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return shlex.quote(arg)


def _join(argv: list[str]) -> str:
    return " ".join(_q(a) for a in argv)


SETUP_FILE = "setup.sh"
"""In the run dir: `cluster.setup`'s lines, then `exec "$@"`; every step's program is started through it."""


def setup_script(lines: tuple[str, ...]) -> str:
    """The run dir's setup.sh: the site's set-up lines, then the step's own program (exec'd: it keeps the pid
    srun signals, and its environment: PMI, SLURM_*, CUDA_VISIBLE_DEVICES)."""
    return "\n".join(["# cluster.setup: run on a step's node before the step's program, which it then becomes",
                      *lines, 'exec "$@"']) + "\n"


def _setup_prefix(step: Step, run_dir: str) -> list[str]:
    return ["bash", f"{run_dir}/{SETUP_FILE}"] if step.setup else []


def role_argv(step: Step, python: str, run_dir: str, image: str = "", data_dir: str = "data",
              binds: tuple[str, ...] = (), het: bool = True) -> list[str]:
    """The command a role's srun step (or one component of an MPMD step) runs, after srun's own options."""
    env = ["env", *(f"{k}={v}" for k, v in step.env)] if step.env else []
    setup = _setup_prefix(step, run_dir)
    if step.mpi:  # its ranks come from MPI itself; mpi4py's runner aborts the world on an uncaught exception
        return [*setup, *env, python, "-m", "mpi4py", "-m", step.module, "--run-dir", run_dir, *step.args]
    inner_py = "python" if image and step.role == "env_worker" else python  # the image's own Python is on PATH
    group = ["--het-group", str(step.group)] if het else []
    argv = [*env, inner_py, "-m", "agentrl.launch.slurm_env", *group, "--",
            inner_py, "-m", step.module, "--run-dir", run_dir, *step.args]
    if image and step.role == "env_worker":  # the set-up runs on the node, outside the container
        return [*setup, *worker_command(image, run_dir, data_dir, argv, binds)]
    return [*setup, *argv]


def srun_argv(step: Step, het: bool, run_dir: str = "$RUN_DIR") -> list[str]:
    """`srun` and the options of a step's first (or only) component."""
    # an MPMD step's one --output takes every component's ranks: one log for the MPI world, as the local
    # launcher's logs/pipeline.log (each line names its rank's role)
    output = f"{run_dir}/logs/pipeline.log" if step.mpmd else f"{run_dir}/logs/{step.role}-%t.log"
    return ["srun", f"--mpi={step.mpi_plugin}", *_component_options(step, het, f"--output={output}")]


def gpu_options(step: Step) -> list[str]:
    """srun's GPU options of a step: each task's GPUs and their binding (`cluster.gpu_binding`)."""
    g = step.gpus_per_task
    if not g:
        return []
    if step.gpu_binding == "gpus-per-task":  # Slurm sets each task's CUDA_VISIBLE_DEVICES to its own GPUs
        return [f"--gpus-per-task={g}", f"--gpu-bind=per_task:{g}"]
    n = min(step.ntasks, step.tasks_per_node)  # gres counts per node
    argv = [f"--gres=gpu:{g * n}"]
    if step.gpu_mask and n > 1:  # local task i gets GPUs i*g .. i*g+g-1
        argv.append("--gpu-bind=mask_gpu:" + ",".join(hex(((1 << g) - 1) << (i * g)) for i in range(n)))
    return argv


def _component_options(step: Step, het: bool, output: str = "") -> list[str]:
    argv = [f"--het-group={step.group}"] if het else []
    # --exact: a step gets only the CPUs it asks for (without it the first step on a node takes the node's
    # whole allocation and the controller's step beside the env workers' waits forever; seen on Slurm 22.05)
    argv += [f"--ntasks={step.ntasks}", "--exact"]
    if step.cpus_per_task:  # srun 22.05-23.02 does not take sbatch's --cpus-per-task: each task would get one
        argv.append(f"--cpus-per-task={step.cpus_per_task}")
    # the job's memory on the step's nodes, without taking it from the group's other steps (a step that asks
    # for none is given all of it where memory is a consumable, and the steps beside it wait)
    argv.append("--mem=0")
    if output:
        argv.append(output)
    argv += gpu_options(step)
    if step.overlap:
        argv.append("--overlap")
    if step.mpi:  # a rank that dies (SIGKILL, OOM) ends the whole MPI world, as mpiexec does: srun alone leaves
        argv.append("--kill-on-bad-exit=1")  # the others waiting on it (seen on Slurm 22.05)
    return argv


def step_argv(step: Step, python: str, run_dir: str, image: str = "", data_dir: str = "data",
              binds: tuple[str, ...] = (), het: bool = True) -> list[str]:
    """The whole srun command of a step: `srun OPTS CMD`, or for an MPMD step `srun OPTS CMD : OPTS CMD ...`
    (one MPI world across the components' het groups)."""
    argv = srun_argv(step, het, run_dir) + role_argv(step, python, run_dir, image, data_dir, binds, het)
    for part in step.mpmd:
        argv += [":", *_component_options(part, het), *role_argv(part, python, run_dir, image, data_dir, binds, het)]
    return argv


def _header_lines(layout: JobLayout, preset: str, overrides: list[str], how: str) -> list[str]:
    cmd = _join(["python", "-m", "jobs.launch", "--preset", preset, "--render-sbatch", *overrides])
    if layout.root == SUBMIT_DIR:
        where = ["# Submit from the repository root, after `bash install.sh`. Logs: <job name>-<job id>.out in the",
                 "# submit directory; each role's in runs/<name>-<job id>/logs/<role>-<task>.log."]
    else:
        where = [f"# Runs in {layout.root} (the repository, after `bash install.sh`; relative paths were resolved",
                 "# against it): submit from anywhere. Logs: <job name>-<job id>.out in the submit directory; each "
                 "role's in RUN_DIR/logs/<role>-<task>.log."]
    return [
        "#!/bin/bash",
        f"# agentrl run {layout.name!r} from preset {preset!r}: {how}.",
        f"# Rendered by `{cmd}`; edit the config, not this file.",
        *where,
        f"# Preemption: {layout.signal_s} s before the time limit Slurm sends USR1; the trainer checkpoints and the",
        "# job requeues under the same id, so the run resumes in the same run directory.",
    ]


def _group_lines(layout: JobLayout, g: int) -> list[str]:
    return [f"#SBATCH --{k}={shlex.quote(v)}" for k, v in layout.groups[g].directives]


def _prepare_lines(layout: JobLayout, preset: str, overrides: list[str], make_model_group: int | None) -> list[str]:
    # the user's overrides are quoted as typed (a `$` in a set-up line stays a `$`); ours may name $SLURM_SUBMIT_DIR
    prepare = " ".join([_join(["$PY", "-m", "jobs.launch", "--preset", preset, "--prepare-run", "$RUN_DIR"]),
                        *(shlex.quote(o) for o in overrides), *(_q(o) for o in layout.overrides)])
    lines = [
        "# config.yaml is written once: a requeued job keeps it (and its checkpoints) and resumes",
        prepare,
    ]
    if layout.setup:
        lines += [f"cat > \"$RUN_DIR/{SETUP_FILE}\" <<'SETUP'", *setup_script(layout.setup).splitlines(), "SETUP"]
    if layout.needs_model and make_model_group is not None:  # the tiny model, built once in the trainer's group
        setup = ["bash", f"$RUN_DIR/{SETUP_FILE}"] if layout.setup else []
        make = ["srun", "--mpi=none", f"--het-group={make_model_group}", "--ntasks=1", *setup, "$PY", "-m",
                "jobs.make_model", "--run-dir", "$RUN_DIR"]
        lines.append(f'[ -f "$RUN_DIR/model/config.json" ] || {_join(make)}')
    return lines


def _site_setup_lines(layout: JobLayout) -> list[str]:
    """`cluster.setup` in the batch shell, before the job's first command (`set -u` would trip many module
    and activate scripts, so it is off around them)."""
    if not layout.setup:
        return []
    return ["# site set-up (cluster.setup): here, and on every step's node before its program (RUN_DIR/setup.sh)",
            "set +u", *layout.setup, "set -u"]


def task_argv(step: Step, task: str, python: str, run_dir: str, image: str = "", data_dir: str = "data",
              binds: tuple[str, ...] = (), het: bool = True) -> list[str]:
    """The srun command of one task of a restartable step (`step.restarts` > 0): its own one-task step, with
    the task's own arguments and log (`<role>-<task>.log`)."""
    one = replace(step, ntasks=1, args=(*step.args, *(a.replace("{task}", task) for a in step.task_args)))
    argv = step_argv(one, python, run_dir, image, data_dir, binds, het)
    return [a.replace("-%t.log", f"-{task}.log") if a.startswith("--output=") else a for a in argv]


def _data_dir(layout: JobLayout) -> str:
    """The task data directory the env workers' containers bind: data/ of the repository."""
    return absolute("data", layout.root)


def _restartable_lines(step: Step, het: bool, image: str, binds: tuple[str, ...], data_dir: str) -> list[str]:
    """A step whose tasks are restarted: one srun step per task inside a bash loop bounded by `step.restarts`,
    all of them under one supervisor (`<role>s N &`), which SIGTERM stops with its steps."""
    argv = task_argv(step, "$1", "$PY", "$RUN_DIR", image, data_dir, binds, het)
    fn, n = step.role, step.restarts
    return [
        f"# {fn}: task $1 as its own step; when it fails it is started again, at most {n} times (meanwhile",
        "# the run goes on without it); SIGTERM stops it and its step",
        f"{fn}() {{",
        f"  local left={n} rc step",
        "  trap 'kill \"$step\" 2>/dev/null; wait \"$step\"; exit 0' TERM",
        "  while :; do",
        f"    {_join(argv)} &",
        "    step=$!",
        '    wait "$step"; rc=$?',
        '    [ "$rc" != 0 ] && [ "$left" -gt 0 ] || return "$rc"',
        "    left=$((left - 1))",
        f'    echo "agentrl: {fn} $1 exited with $rc; starting it again ($left restarts left)"',
        "  done",
        "}",
        f"# {fn}s N: tasks 0..N-1, each under {fn}; SIGTERM stops them all. Exit status: the last failure's",
        f"{fn}s() {{",
        "  local pids=() i rc=0",
        "  trap 'kill \"${pids[@]}\" 2>/dev/null; wait; exit 0' TERM",
        f'  for ((i = 0; i < $1; i++)); do {fn} "$i" & pids+=($!); done',
        '  for i in "${pids[@]}"; do wait "$i" || rc=$?; done',
        '  return "$rc"',
        "}",
    ]


def _step_line(layout: JobLayout, step: Step, het: bool, image: str, binds: tuple[str, ...]) -> str:
    if step.restarts:
        where = f"het group {step.group}, " if het else ""
        lines = _restartable_lines(step, het, image, binds, _data_dir(layout))
        lines.append(f"# {step.role}: {where}{step.ntasks} task{'s' if step.ntasks > 1 else ''}, a step each")
        return "\n".join([*lines, f"{step.role}s {step.ntasks} &", f"{step.role.upper()}=$!"])
    argv = step_argv(step, "$PY", "$RUN_DIR", image, _data_dir(layout), binds, het)
    parts = (step, *step.mpmd)
    where = [f"{p.role}: " + (f"het group {p.group}, " if het else "") + f"{p.ntasks} task{'s' if p.ntasks > 1 else ''}"
             for p in parts]
    note = "# " + "; ".join(where)
    if step.mpmd:
        note = (f"# one MPI world (an MPMD step across het groups; world rank 0 is the {step.role}):\n{note}\n"
                "# srun passes USR1 to every rank: the trainer checkpoints and stops the rollout ranks, who ignore it")
    if step.step_restarts:
        return "\n".join([note, *_pipeline_lines(step, _join(argv))])
    return f"{note}\n{_join(argv)} &\n{step.role.upper()}=$!"


def _pipeline_lines(step: Step, command: str) -> list[str]:
    """The MPMD step as `pipeline` (start it, its srun's pid in $TRAINER, where the USR1 trap finds it) and
    `wait_pipeline` (wait for it; when it fails and the job was not preempted, clear the pipeline's
    rendezvous keys and start it again, at most `step.step_restarts` times). Both run in the script's own
    shell: a restarted step is its child, and USR1 goes to the live one."""
    var, n = step.role.upper(), step.step_restarts
    return [
        "pipeline() {",
        f"  {command} &",
        f"  {var}=$!",
        "}",
        "# wait_pipeline: wait for the MPI world; when it fails (a rank died) before the run finished and no USR1",
        "# came, clear its rendezvous keys (the dead trainer's MPI port, broadcast store, channel nonce) and start",
        f"# it again, at most {n} times: the trainer resumes from its newest checkpoint, the rollout ranks start a",
        "# new incarnation. Exit status: the last step's",
        "wait_pipeline() {",
        f"  local left={n} rc",
        "  while :; do",
        f'    wait_step "${var}"; rc=$?',
        '    [ "$rc" != 0 ] && [ "$preempted" = 0 ] && [ "$left" -gt 0 ] || return "$rc"',
        '    [ ! -f "$RUN_DIR/report/summary.json" ] || return "$rc"  # finished: a failure on the way out stays one',
        "    left=$((left - 1))",
        '    echo "agentrl: the pipeline (trainer and rollout ranks, one MPI world) exited with $rc; clearing its '
        'rendezvous keys and starting it again ($left restarts left)"',
        '    "$PY" -m jobs.launch --clear-pipeline "$RUN_DIR" || return "$rc"',
        '    [ "$preempted" = 0 ] || return "$rc"  # USR1 meanwhile: no step to checkpoint; the job requeues',
        "    pipeline",
        "  done",
        "}",
        "pipeline",
    ]


def _finish_lines(ends: list[str], others: list[str], restarted: bool = False) -> list[str]:
    """Wait for the trainer first: after a USR1 it checkpoints and exits while the rollout still runs,
    and the job requeues at once. Then the other roles that end the run; then stop the rest. `restarted`:
    the trainer's step is the restartable pipeline, waited for by `wait_pipeline`."""
    ends = sorted(ends, key=lambda name: name != "TRAINER")
    first = "wait_pipeline" if restarted else f'wait_step "${ends[0]}"'
    lines = ["status=0", f"{first} || status=$?"]
    lines += [
        'if [ "$preempted" = 1 ]; then',
        '  echo "agentrl: requeueing job $SLURM_JOB_ID"',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "  exit 0",
        "fi",
        "trap '' USR1  # the trainer is done: a late warning changes nothing",
    ]
    for name in ends[1:]:
        lines.append(f'wait_step "${name}" || status=$?')
    if others:
        lines.append("kill " + " ".join(f'"${o}"' for o in others) + " 2>/dev/null || true  # srun passes SIGTERM on")
        lines.append("wait")
    lines.append('exit "$status"')
    return lines


def render_hetjob(layout: JobLayout, preset: str, overrides: list[str], image: str = "",
                  binds: tuple[str, ...] = ()) -> str:
    """One heterogeneous job: groups 0 trainer, 1 rollout, 2 env workers (+ controller)."""
    lines = _header_lines(layout, preset, overrides, "one heterogeneous Slurm job")
    lines += [
        f"#SBATCH --job-name=agentrl-{layout.name}",
        "#SBATCH --output=%x-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        f"#SBATCH --signal=B:USR1@{layout.signal_s}",
    ]
    for g in (TRAINER, ROLLOUT, ENV):
        if g:
            lines.append("#SBATCH hetjob")
        lines.append(f"# het group {g}: {GROUP_NAMES[g]}" + (" + controller" if any(
            s.role == "controller" and s.group == g for s in layout.steps) else ""))
        lines += _group_lines(layout, g)
    lines += [
        "",
        "set -euo pipefail",
        ': "${SLURM_JOB_ID:?submit this script with sbatch}"',
        f"cd {_q(layout.root)}",
        *_site_setup_lines(layout),
        f'PY=${{AGENTRL_PYTHON:-{layout.python}}}',
        f'RUN_DIR={_q(layout.run_root)}/{layout.name}-"$SLURM_JOB_ID"',
        'mkdir -p "$RUN_DIR/logs"',
        "export AGENTRL_REQUEUE_BY_SCRIPT=1  # the trainer checkpoints and exits on USR1; this script requeues",
        *_prepare_lines(layout, preset, overrides, TRAINER),
        "",
        "set +e  # from here on a role's exit status is collected, not fatal",
        _WAIT_STEP,
        _TRAP_USR1,
        "",
    ]
    for step in layout.steps:
        lines.append(_step_line(layout, step, True, image, binds))
    ends = [s.role.upper() for s in layout.steps if s.ends_run]
    others = [s.role.upper() for s in layout.steps if not s.ends_run]
    lines += ["", "# the run ends when rollout and trainer have; then the env side is stopped"]
    lines += _finish_lines(ends, others, any(s.step_restarts for s in layout.steps))
    return "\n".join(lines) + "\n"


def render_per_role(layout: JobLayout, preset: str, overrides: list[str], image: str = "",
                    binds: tuple[str, ...] = ()) -> str:
    """One job per role for sites without hetjobs: a bash file that submits them in order."""
    lines = _header_lines(layout, preset, overrides, "one job per role (cluster.hetjob=false)")
    lines[3] = ("# Run it (do not sbatch it) from the repository root, after `bash install.sh`: it submits the"
                if layout.root == SUBMIT_DIR else
                f"# Run it (do not sbatch it), after `bash install.sh` in {layout.root} (where it runs): "
                "it submits the")
    lines[4] = "# jobs. Logs: <job name>-<job id>.out here; each role's in the run dir's logs/<role>-<task>.log."
    lines += [
        "set -euo pipefail",
        # paths relative to the submit directory: the jobs below are submitted from here
        "SLURM_SUBMIT_DIR=$PWD" if layout.root == SUBMIT_DIR else f"cd {_q(layout.root)}",
        *_site_setup_lines(layout),
        f'PY=${{AGENTRL_PYTHON:-{layout.python}}}',
        f'RUN_DIR={_q(layout.run_root)}/{layout.name}-$(date +%Y%m%d-%H%M%S)',
        'mkdir -p "$RUN_DIR/logs"',
        *_prepare_lines(layout, preset, overrides, None),
        "export AGENTRL_RUN_DIR=$RUN_DIR AGENTRL_PYTHON=$PY",
    ]
    by_group = {g: [s for s in layout.steps if s.group == g] for g in (ENV, TRAINER, ROLLOUT)}
    previous = ""
    for g in (ENV, TRAINER, ROLLOUT):
        var = f"{GROUP_NAMES[g].upper()}_JOB"
        dep = f" --dependency=after:${previous}" if previous else ""
        lines.append(f"{var}=$(sbatch --parsable{dep} <<'JOB'")
        lines += [
            "#!/bin/bash",
            f"#SBATCH --job-name=agentrl-{layout.name}-{GROUP_NAMES[g]}",
            "#SBATCH --output=%x-%j.out",
            "#SBATCH --open-mode=append",
            "#SBATCH --requeue",
        ]
        if g == TRAINER:
            lines.append(f"#SBATCH --signal=B:USR1@{layout.signal_s}")
        lines += _group_lines(layout, g)
        lines += ["set -u", f"cd {_q(layout.root)}", *_site_setup_lines(layout),
                  "PY=$AGENTRL_PYTHON RUN_DIR=$AGENTRL_RUN_DIR", _WAIT_STEP]
        if g == TRAINER:
            lines += [_TRAP_USR1, "export AGENTRL_REQUEUE_BY_SCRIPT=1"]
        if g == TRAINER and layout.needs_model:
            setup = f'bash "$RUN_DIR/{SETUP_FILE}" ' if layout.setup else ""
            lines.append(f'[ -f "$RUN_DIR/model/config.json" ] || srun --mpi=none --ntasks=1 {setup}"$PY" -m '
                         'jobs.make_model --run-dir "$RUN_DIR"')
        if g == ROLLOUT and layout.needs_model:
            lines.append('until [ -f "$RUN_DIR/model/config.json" ]; do sleep 5; done  # the trainer job builds it')
        for step in by_group[g]:
            lines.append(_step_line(layout, step, False, image, binds))
        names = [s.role.upper() for s in by_group[g]]
        if g == ENV:  # serves until the rollout job cancels it
            lines += ['wait_step "$ENV_WORKER"']
        elif g == TRAINER:
            lines += _finish_lines(names, [])
        else:
            lines += ['wait_step "$ROLLOUT"; status=$?', 'scancel "$AGENTRL_ENV_JOB"', 'exit "$status"']
        lines.append("JOB")
        lines.append(")")
        if g == ENV:
            lines.append("export AGENTRL_ENV_JOB=$ENV_JOB")
        previous = var
    lines.append('echo "submitted: env $ENV_JOB, trainer $TRAINER_JOB, rollout $ROLLOUT_JOB; run dir $RUN_DIR"')
    return "\n".join(lines) + "\n"


def render_run(cfg: RunConfig, preset: str, overrides: list[str], root: str = SUBMIT_DIR) -> str:
    """`cfg`'s whole script, run from `root` (the repository on the compute nodes; relative paths of the
    config, the workers' image and binds among them, are resolved against it). `preset` and `overrides`
    are what the script passes on to `jobs.launch --prepare-run`."""
    env = cfg.cluster.env
    image = absolute(env.apptainer_image, root)
    binds = tuple(absolute(b, root) for b in env.binds)
    render = render_hetjob if cfg.cluster.hetjob else render_per_role
    return render(topology.plan(cfg, root), preset, overrides, image, binds)
