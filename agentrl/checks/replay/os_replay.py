"""The os gold replay: the task's scripted expert (its example scripts), through the public Task API;
a failure classified from the episode itself and from replays of the sample's own scripts (see
`replay_os`)."""
from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agentrl.checks.replay.classes import DATA, HOST, NETWORK, NETWORK_COMMANDS, OURS, Outcome
from agentrl.serving.session import Session
from agentrl.tasks.api import EnvError, Task
from agentrl.tasks.os_task import SCRIPT_TIMEOUT_S, OsEpisode, OsProblem, script_argv
from agentrl.tasks.shared import call_message
from agentrl.types import Status

NETWORK_ERRORS = re.compile(r"Temporary failure resolving|Could not resolve|Network is unreachable|Failed to fetch|"
                            r"Method http has died|Could not connect|Name or service not known|"
                            r"index files failed to download")
"""What a setup script that needed the network prints here (the sandbox has a loopback only)."""
COUNTS_PROCESSES = re.compile(r"\bps\b")
BAD_FD = re.compile(r"\b(\d+): Bad file descriptor")
"""bash's message for a redirection to a file descriptor it cannot open (e.g. `echo 123321>f`: fd 123321)."""
DOCKER_NOFILE = 1048576
"""The open-file limit Docker gave containers up to containerd 1.7. With Docker Engine 29 / containerd 2.1
a container's soft limit is the host's, 1024 by default (moby/moby#51485): there AgentBench-FC's own
container cannot make a redirection to fd 123321 either."""
REPLAYS, REPLAY_BUDGET_S = 12, 60.0  # `_varies_between_runs`: runs of the example, and their time bound


def replay_os(task: Task, index: str) -> Outcome:
    """The os task's scripted expert on one sample, through the public Task API; a failure classified
    from the episode's `setup_failed` metric, its last observation and the expert's own scripts."""
    try:
        session = Session(task, index)
    except EnvError as e:
        return False, OURS, f"did not start: {e.message}"
    try:
        example = _script(session.expert_message())  # before any action: the sample's example script
        result = None
        for _ in range(task.max_turns):
            result = session.interact(session.expert_message())
            if result.done:
                break
    except EnvError as e:
        return False, OURS, f"env_error: {e.message}"
    finally:
        session.close()
    assert result is not None
    if result.done and result.status == Status.COMPLETED and result.reward == 1.0:
        return True, "", ""
    last = str(result.messages[-1].get("content") or "") if result.messages else ""
    last_line = last.removesuffix("); the sample ends.").strip().rsplit("\n", 1)[-1]
    if result.metrics.get("setup_failed"):
        offline = NETWORK_ERRORS.search(last)
        if offline:
            line = last[last.rfind("\n", 0, offline.start()) + 1:].split("\n", 1)[0]
            return False, NETWORK, f"setup failed without the network: {line.strip()[:200]!r}"
        if NETWORK_COMMANDS.search(example):
            return False, NETWORK, (f"the example uses the network ({example.strip()[:80]!r}); the setup also "
                                    f"failed here: {last_line[:200]!r}")
        limited = _beyond_open_files(task, index, last)
        if limited:
            return False, HOST, limited
        return False, OURS, f"setup fails here (a sandbox limit; AgentBench's container runs it): {last_line[:240]!r}"
    if NETWORK_COMMANDS.search(example):
        return False, NETWORK, f"the example uses the network: {example[:120]!r}"
    classifiers = (lambda: _counts_its_grader(task, index, example),
                   lambda: _varies_between_runs(task, index, session.episode),
                   lambda: _changes_what_it_reports(task, index),
                   lambda: _rejects_its_own_example(task, index))
    for classify in classifiers:  # in order, each only if the ones before found nothing
        found = classify()
        if isinstance(found, tuple):
            return False, *found
        if found:
            return False, DATA, found
    return False, OURS, f"status {result.status.value}, reward {result.reward}"


def _script(message: dict[str, Any]) -> str:
    """The script of a bash_action message ("" for any other)."""
    for call in message.get("tool_calls") or []:
        if call["function"]["name"] == "bash_action":
            return str(json.loads(call["function"]["arguments"]).get("script", ""))
    return ""


def _counts_its_grader(task: Task, index: str, example: str) -> str | None:
    """Evidence that a sample's expected answer counts the grader's own process, or None.

    Such a sample's check compares the answer with the output of its example script run by the grader.
    AgentBench runs that as `execute_independent`: a `docker exec bash -c EXAMPLE` in the container,
    beside the agent's interactive shell, so a `ps` in the example sees one process (that `bash -c`)
    more than the same script typed in the agent's shell, and the answer the shell gives is one short.
    The sandbox reproduces the process structure (a command's `bash` in the shell; an idle `bash`
    standing in for the interactive shell plus the grader's own process at check time). The evidence:
    the example prints an integer n in the agent's shell, n fails the sample's own check scripts from
    the checkout, and n + 1 passes them. On AgentBench main 578c5e9 these are test-56 (`ps -A | wc -l`)
    and test-131 (`ps -e | wc -l` plus `who | wc -l`).
    """
    if not COUNTS_PROCESSES.search(example):
        return None
    outcomes: dict[int, float] = {}
    for offset in (0, 1):
        session = Session(task, index)
        try:
            r = session.interact(call_message([("bash_action", {"script": example})], 0))
            text = str(r.messages[0].get("content") or "") if r.messages else ""
            number = re.fullmatch(r"(?:The output of the OS:\n\n)?\s*(-?\d+)\s*", text)
            if r.done or number is None:
                return None
            n = int(number.group(1))
            r = session.interact(call_message([("answer_action", {"answer": str(n + offset)})], 1))
            outcomes[offset] = r.reward
        finally:
            session.close()
    if outcomes == {0: 0.0, 1: 1.0}:
        return (f"the example counts processes ({example.strip()[:80]!r}); the grader runs it beside the shell as "
                f"its own `bash -c` (AgentBench: execute_independent), so the check wants one more than the "
                f"shell prints: n fails, n + 1 passes")
    return None


@contextmanager
def _fresh_episode(task: Task, index: str) -> Iterator[OsEpisode | None]:
    """A new session on the sample, its os episode set up (init and start run); None for another task's
    episode or a setup that failed. The session is closed on leaving."""
    session = Session(task, index)
    try:
        episode = session.episode
        if not isinstance(episode, OsEpisode):
            yield None
            return
        _ = episode.shell  # the sandbox, its init and start scripts run
        yield None if episode.setup_error else episode
    finally:
        session.close()


def _compares_with_example(problem: OsProblem) -> bool:
    """Whether the check compares the answer with the example's output (a `null` entry stands for it)."""
    return bool(problem.check) and None in (problem.check or []) and problem.example is not None


def _varies_between_runs(task: Task, index: str, failed: Any) -> str | tuple[str, str] | None:
    """Evidence that the example's output is not a function of the sample's state, or None.

    For a check that compares the answer with the example's output, the answer (the example run in the
    agent's shell) and the reference (the example run again by the grader) can differ for no fault of
    either side when the example's output varies between runs: a race in the example itself (test-57's
    `ps -ef | grep -i bash | grep -v grep | wc -l` counts the pipeline's own forks that have not exec'd
    `grep` yet, as AgentBench's shell would). The evidence: the example, run as the expert runs it
    (`OsEpisode.bash`, the bash_action of the episode) once in each of `REPLAYS` fresh sessions (each
    from the sample's own starting state: an example that changes what it counts, such as one that
    appends to PATH, prints the same first output every time; bounded by `REPLAY_BUDGET_S`), plus its
    output in the failed episode `failed`, gives more than one output. Unless the variation is the
    sample's own setup's and the example is stable on one state: when in two fresh sessions the shell
    prints the same twice and a grader right after prints something else, the failure is ours (the
    grader's view is not the agent's: test-19 on 639fcf2, whose init writes 99 files within one clock
    tick, so which is "newest" varies between sessions, and whose grader saw a /usr/local made afresh).
    """
    if not isinstance(failed, OsEpisode) or not failed.ran_example or not _compares_with_example(failed.problem):
        return None
    outputs = [failed.last_output.strip()]
    deadline = time.monotonic() + REPLAY_BUDGET_S
    for _ in range(REPLAYS):
        with _fresh_episode(task, index) as episode:
            if episode is None or episode.example is None:
                return None
            r = episode.bash(episode.example)
            if r.timed_out:
                return None
            outputs.append(r.output.strip())
        if time.monotonic() > deadline:
            break
    counts = Counter(outputs)
    if len(counts) < 2:
        return None
    shown = dict(sorted(counts.items(), key=lambda kv: -kv[1])[:6])
    views = [_shell_and_grader(task, index) for _ in range(2)]
    if all(v is not None and v[0] == v[1] != v[2] for v in views):
        v = views[0]
        assert v is not None
        return OURS, (f"the example's output varies between fresh sessions ({shown}: the sample's own setup varies), "
                      f"but not on one state: in one session the shell prints {v[0][:40]!r} twice, and a grader's "
                      f"run right after {v[2][:40]!r} (twice so): the grader's view differs from the agent's shell")
    return (f"the example's output varies between runs of the same state: {shown} ({len(outputs)} runs: the "
            f"failed episode's {outputs[0][:40]!r} and {len(outputs) - 1} in fresh sessions), so "
            "the answer and the grader's own run of the example need not agree")


def _shell_and_grader(task: Task, index: str) -> tuple[str, str, str] | None:
    """In a fresh session: the example's output in the shell, again in the shell, then run as a grader."""
    with _fresh_episode(task, index) as episode:
        if episode is None or episode.example is None or episode.problem.example is None:
            return None
        runs = [episode.bash(episode.example) for _ in range(2)]
        g = episode.shell.run_independent(script_argv(episode.problem.example, []), timeout=SCRIPT_TIMEOUT_S,
                                          freeze=True)
        if any(r.timed_out for r in runs) or g.exit_code != 0:
            return None
        return runs[0].output.strip(), runs[1].output.strip(), g.output.strip()


def _changes_what_it_reports(task: Task, index: str) -> tuple[str, str] | None:
    """(class, evidence) when the grader's run of the example reports other than the agent's shell, or None.

    For a check that compares the answer with the example's output, the answer comes from the example
    run in the agent's shell, and the grader then runs the example again on the state that run left
    (AgentBench's grader too: it runs the example after the answer). Two causes tell apart:
      * a data defect: the example edits what it counts (train-683 removes the duplicate lines it
        counted), so it prints less the second time wherever it runs, and no answer from its first run
        passes. The evidence: in a fresh session the shell prints a, the grader's rerun b != a; in a
        second fresh session the shell prints a again (a function of the state, not a race: that is
        `_varies_between_runs`) and a second run in the shell prints something else as well;
      * our defect: the shell's second run prints a again, so the state did not change, yet the grader
        prints b: the grader's view of the system is not the agent's (test-42's `du -sh /usr` and
        test-19's `ls -lt /usr` on 639fcf2, where the session's /usr and a grader's differed).
    """
    firsts: list[str] = []
    second = again = ""
    for attempt in range(2):
        with _fresh_episode(task, index) as episode:
            if episode is None or episode.example is None or not _compares_with_example(episode.problem):
                return None
            r = episode.bash(episode.example)
            if r.timed_out:
                return None
            firsts.append(r.output.strip())
            if attempt == 0:
                assert episode.problem.example is not None
                g = episode.shell.run_independent(script_argv(episode.problem.example, []), timeout=SCRIPT_TIMEOUT_S,
                                                  freeze=True)
                if g.exit_code != 0:
                    return None
                second = g.output.strip()
            else:
                r = episode.bash(episode.example)
                if r.timed_out:
                    return None
                again = r.output.strip()
    if firsts[0] != firsts[1] or second == firsts[0]:
        return None
    if again == firsts[1]:
        return OURS, (f"the grader's view differs from the agent's shell: the example prints {firsts[0][:40]!r} in the "
                      f"shell, twice on one state (so it changes nothing it reports on), and "
                      f"{second[:40]!r} run as the "
                      "grader runs it right after")
    return DATA, (f"the example changes the state it reports on: in the agent's shell it prints {firsts[0][:40]!r}, "
                  f"and the grader's rerun on the state that run left prints {second[:40]!r} (a second fresh "
                  f"session's first run prints the first again, its second run {again[:40]!r}); AgentBench's "
                  "grader also reruns the example after the answer")


def _rejects_its_own_example(task: Task, index: str) -> str | None:
    """Evidence that the sample's check scripts fail an answer equal to its example's output, or None.

    For a check that compares the answer with the example's output (a `null` entry), the example is run
    as a grader in a fresh session (an independent program, stdout only), and the check then runs as
    the episode runs it (each script an independent program with the answer and the earlier scripts'
    outputs as arguments) with that output as the answer. A script of the sample's own (not the
    example) that fails there, while each `null` entry printed that same output again, rejects the very
    output it asks for; its last stderr line is shown (rerun with stderr). On AgentBench main 578c5e9
    this is dev-8: `size-match.py` does `int(size_str[:-len(unit)])`, which raises on `du -h`'s "4.0K".
    """
    with _fresh_episode(task, index) as episode:
        if episode is None or not _compares_with_example(episode.problem):
            return None
        problem, shell = episode.problem, episode.shell
        assert problem.example is not None and problem.check is not None
        run = shell.run_independent(script_argv(problem.example, []), timeout=SCRIPT_TIMEOUT_S, freeze=True)
        if run.exit_code != 0:
            return None
        answer = run.output.strip()
        params = [answer]
        for n, script in enumerate(problem.check):
            argv = script_argv(problem.example if script is None else script, params)
            r = shell.run_independent(argv, timeout=SCRIPT_TIMEOUT_S, freeze=True)
            if r.exit_code == 0:
                if script is None and r.output.strip() != answer:  # an example that varies: not this class
                    return None
                params.append(r.output)
                continue
            if script is None or r.timed_out:  # the example itself failing, or a slow grader: not this class
                return None
            shown = shell.run_independent(argv, timeout=SCRIPT_TIMEOUT_S, stderr=True, freeze=True)
            lines = [line for line in shown.output.strip().splitlines() if line.strip()]
            error = lines[-1].strip() if lines else f"exit {r.exit_code}, no message"
            return (f"the check rejects its own example's output: answer {answer[:60]!r} (the example "
                    f"{problem.example[1].strip()[:60]!r} run as the grader runs it), and check script {n + 1} "
                    f"of {len(problem.check)} fails on it: {error[:200]!r}")
    return None


def _beyond_open_files(task: Task, index: str, observation: str) -> str | None:
    """Evidence that a failed setup opened a file descriptor above the sandbox's open-file limit, or None.

    bash reads `echo 123321>f` as a redirection of fd 123321, which needs RLIMIT_NOFILE above 123321;
    AgentBench's Docker containers allow 1048576 up to containerd 1.7 and 1024 after (`DOCKER_NOFILE`),
    while a worker that may not raise its hard limit (no CAP_SYS_RESOURCE) gives its sandboxes its own
    (`SandboxConfig.nofile()`). So the sample passes or fails by the host, here as in AgentBench-FC.
    The evidence: the setup's last observation says `N: Bad file descriptor`, and N is at least
    `ulimit -n` read in a fresh session of the same sample (as an independent program in its sandbox).
    """
    fds = [int(m.group(1)) for m in BAD_FD.finditer(observation)]
    if not fds:
        return None
    session = Session(task, index)
    try:
        episode = session.episode
        if not isinstance(episode, OsEpisode):
            return None
        r = episode.shell.run_independent(["bash", "-c", "ulimit -n"], timeout=SCRIPT_TIMEOUT_S)
    finally:
        session.close()
    if r.exit_code != 0 or not r.output.strip().isdigit():
        return None
    fd, limit = max(fds), int(r.output.strip())
    if fd < limit:
        return None
    return (f"the setup redirects file descriptor {fd} ('{fd}: Bad file descriptor'), at or above the sandbox's "
            f"open-file limit {limit} (`ulimit -n` in it; Docker containers allow {DOCKER_NOFILE} up to containerd "
            "1.7, 1024 with Docker 29 / containerd 2.1, where AgentBench-FC fails this setup too); "
            f"fix: a worker allowed to raise RLIMIT_NOFILE above {fd} (root with CAP_SYS_RESOURCE, or a higher "
            "`ulimit -Hn`; SandboxConfig.nofile(), sandbox/userns.py)")

