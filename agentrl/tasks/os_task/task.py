"""`os`: AgentBench-FC's operating-system task: bash in a per-session sandbox, then an answer or a check.

Tools, schemas and the round limit are AgentBench-FC's (`bash_action`, `answer_action`,
`finish_action`; 8 rounds). Each session gets its own sandbox (`agentrl.sandbox.Shell`) on its own
root file system, with a shell whose working directory, variables and background jobs carry over
between rounds, like AgentBench's container shell, starting in /root. A sample runs as AgentBench's
file describes it: its `create.init` scripts run first, each as an independent program; if one fails
the sample ends at the agent's first action with reward 0 (AgentBench stops such a sample before the
agent acts); its `start` script then runs in the shell (background jobs it starts stay alive, their
output goes nowhere). Evaluation is AgentBench's: `match` compares the stripped answer with the
expected string (or searches a `regex`); `check` runs its scripts in order as independent programs
with the answer and then each earlier script's stdout as arguments, a `null` script standing for the
sample's `example` (so the reference answer is computed in the agent's own sandbox), and passes when
every script exits 0.

Graders the policy cannot touch: every check and example script runs as a separate process started
by the sandbox's driver (its end and exit status come from the driver, never from parsing output), in
/root with a fixed environment, python scripts by the image's pristine `python3 -I -S`, bash scripts
with the image's pristine tools first on PATH (the session's /usr/bin is its own, writable copy),
stdout only, and every process the agent left running stopped (SIGSTOP) while a grader runs.

Two protocols (task option `protocol`):
  * "strict" (default with `source="ours"`): this project's prompt; the first tool call of a message
    runs, the others are answered with a note and not run (one action per round, as the prompt says and
    AgentBench-FC does); calls are checked against the schemas by the shared layer
    (malformed ones get an "Error: ..." observation); `finish_action` commits no answer (a `match`
    fails, a `check` gets "" as the answer); observations are the raw output (800/780 truncation).
  * "faithful" (default with `source="agentbench"`): AgentBench-FC's own protocol, with the tools and
    prompts read from the checkout (`agentrl.tasks.os_task.faithful`): the first tool call only, its
    argument values whatever their keys, `finish_action`'s thought as the answer, AgentBench's
    observation texts. docs/tasks.md lists every difference that remains.

Reward: 1.0 if the evaluation passes, else 0.0; status "completed"; metrics {"success", "setup_failed"}.
Splits: with `source="ours"` (default) train/test are this project's generated samples
(`data/os/{train,test}.json`, made by `agentrl.tasks.os_task.data`); with `source="agentbench"` they
are AgentBench's own, read from the checkout in `agentbench_dir` / `AGENTRL_AGENTBENCH_DIR` in its own
layout (a split whose files are missing is left out). "dev" is AgentBench's dev subset (26 samples),
from the checkout or from this project's copy in `data/agentbench/os_interaction/`.

The scripted expert runs the sample's example script (if it has one; stderr dropped, as a grader sees
it), then answers: the expected string for a `match`, the example's output for an answer `check` or
for a state check whose example printed something, else `finish_action`. With `expert_skill` below 1
it plays a share of the samples wrong (`shared.expert_skilled`): at its first turn, before any command,
it answers a question with a guess (one that a `match` rejects or that differs from the example's
output) and declares an operation done. Because the tasks block (sandbox processes), `blocking = True`.
"""
from __future__ import annotations

import copy
import glob
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

from agentrl.sandbox import (
    CommandResult,
    SandboxConfig,
    Shell,
    budgets,
    check_image,
    check_slots,
    select_backend,
    session_budget,
)
from agentrl.tasks.api import Action, StepResult, message_deadline, tool_message
from agentrl.tasks.options import OsOptions
from agentrl.tasks.os_task import faithful as ab
from agentrl.tasks.os_task.problems import OsProblem, load_problems, parse_problem, script_argv, shell_command
from agentrl.tasks.protocol import CallPolicy, resolve_protocol
from agentrl.tasks.shared import (
    call_message,
    checked_skill,
    data_root,
    env_path,
    expert_skilled,
    split_index,
    split_indices,
)
from agentrl.types import Status

__all__ = ["OsTask", "OsEpisode", "FaithfulOsEpisode", "format_output", "parse_problem", "script_argv"]

log = logging.getLogger(__name__)

MAX_ROUNDS = 8
OUTPUT_LIMIT, OUTPUT_KEEP = 800, 780  # AgentBench's truncation of one command's output
SCRIPT_TIMEOUT_S = 60.0  # init-time example scripts (the reference answer)
ONE_CALL = "Error: only the first tool call of a message is executed; this one was not."
INIT_TIMEOUT_S = 300.0  # init scripts: AgentBench sets none, and some of its train samples `sleep 60`
GUESSES = ("", "0", "none")  # the unskilled expert's answers to a question it has not looked into, in order

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "bash_action",
        "description": "Execute bash code to perform an operation in the Linux environment.",
        "parameters": {"type": "object", "properties": {
            "script": {"type": "string", "description": "The bash script to be executed."}},
            "required": ["script"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "finish_action",
        "description": "Indicate that the task has been finished or need some additional information to be finished.",
        "parameters": {"type": "object", "properties": {
            "thought": {"type": "string", "description": "The thought or reason indicating the task is finished."}},
            "required": ["thought"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "answer_action",
        "description": "Provide the answer to the question.",
        "parameters": {"type": "object", "properties": {
            "answer": {"type": "string", "description": "The answer to the question."}},
            "required": ["answer"], "additionalProperties": False}}},
]

SYSTEM_PROMPT = (
    "You are working on a Linux (Ubuntu) machine through a bash shell, as its root user. Do what the user "
    "asks, or answer the user's question, by calling the tools:\n"
    "- bash_action runs a bash script in the shell; the shell is the same across calls, so the working "
    "directory and variables persist. Scripts must not wait for input. Long output is truncated, and a "
    "script that runs too long is stopped.\n"
    "- answer_action gives your answer to a question; answer with the value only.\n"
    "- finish_action says that the operation you were asked to do is done.\n"
    "Call exactly one tool in each turn.")


def format_output(result: CommandResult, timeout_s: float) -> str:
    """The strict protocol's observation for one bash_action."""
    text = result.output
    if len(text) > OUTPUT_LIMIT:
        text = text[:OUTPUT_KEEP] + f"\n[truncated: the output has {len(result.output)} characters]"
    elif result.truncated:
        text += "\n[truncated]"
    if result.timed_out:
        note = (f"Error: the script did not finish within {timeout_s:g} s and was stopped, with the processes "
                "it started. Files, the working directory and variables set before are kept.")
        return f"{text}\n{note}" if text else note
    return text if text else "(no output)"


class SessionBudget:
    """Live sandboxes of one task, at most `limit` (the host's PID budget over per-session nproc), each with a
    slot number of its own (the lowest free): its uid range (`SandboxConfig.uid_range`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.taken: set[int] = set()
        self._lock = threading.Lock()

    @property
    def live(self) -> int:
        return len(self.taken)

    def acquire(self) -> int:
        with self._lock:
            if self.live >= self.limit:
                raise RuntimeError(f"os: {self.live} sandboxes are live, the host's tables allow {self.limit} "
                                   f"(pids, open files and ptys: sandbox.pid_fraction, host_share, nproc, "
                                   f"open_files, ptys)")
            slot = next(i for i in range(len(self.taken) + 1) if i not in self.taken)
            self.taken.add(slot)
            return slot

    def release(self, slot: int) -> None:
        with self._lock:
            self.taken.discard(slot)


class OsEpisode:
    """One sample in its own sandbox (strict protocol). `close()` ends the sandbox; the Session calls it."""


    def __init__(self, problem: OsProblem, sandbox: SandboxConfig, budget: SessionBudget | None = None,
                 example_state: str = "start", skilled: bool = True) -> None:
        if example_state not in EXAMPLE_STATES:
            raise ValueError(f"os: unknown example_state {example_state!r} ({' | '.join(EXAMPLE_STATES)})")
        self.problem = problem
        self.cfg = sandbox
        self.budget = budget
        self.example_state = example_state
        self.reference: CommandResult | None = None
        """The example's run on the state before the agent acted (example_state "start")."""
        self.deadline = float("inf")  # of the message being handled (`message_deadline`)
        self.grader_failure: str | None = None
        self._shell: Shell | None = None
        self.slot = 0  # this session's uid range, from the task's budget
        self.closed = False
        self.setup_error: str | None = None
        self.last_output = ""
        self.steps = 0  # steps taken so far: the expert's call ids
        # The expert runs the example as a grader does: its stdout is the reference answer, its stderr
        # (e.g. `find /` over /proc) is not.
        self.example = f"{{ {shell_command(problem.example)}\n}} 2>/dev/null" if problem.example else None
        self.ran_example = False  # whether the example script has run in the shell (drives the expert)
        self.skilled = skilled  # False: the expert answers before it has run a command (`shared.expert_skilled`)
        self._guess: str | None = None  # the unskilled expert's answer, chosen once

    @property
    def shell(self) -> Shell:
        """The sandbox, made on first use (before the agent's first command): init, then start."""
        if self._shell is None:
            if self.closed:
                raise RuntimeError("the episode is closed")
            if self.budget is not None:
                self.slot = self.budget.acquire()
            try:
                shell = Shell(self.cfg, uid_slot=self.slot)
            except BaseException:
                if self.budget is not None:
                    self.budget.release(self.slot)
                raise
            self._shell = shell
            for n, script in enumerate(self.problem.init):
                r = shell.run_independent(script_argv(script, []), timeout=INIT_TIMEOUT_S, stderr=True, view=False)
                if r.exit_code != 0:
                    self.setup_error = (f"init script {n + 1} of {len(self.problem.init)} failed (exit "
                                        f"{r.exit_code}): {r.output.strip()[-800:]}")
                    log.warning("os sample setup failed: %s", self.setup_error)
                    return shell
            if self.problem.start:  # AgentBench runs it in the shell and ignores its exit status
                shell.run(shell_command(self.problem.start), timeout=SCRIPT_TIMEOUT_S)
            p = self.problem
            if self.example_state == "start" and p.example is not None and p.check and None in p.check:
                self.reference = shell.run_independent(script_argv(p.example, []), timeout=SCRIPT_TIMEOUT_S,
                                                       freeze=True)
        return self._shell

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"My problem is:\n\n{self.problem.description}"}]

    def _setup_failed(self, call_id: str | None, name: str) -> StepResult | None:
        """The ending of a sample whose setup failed (checked at the agent's first action)."""
        _ = self.shell
        if self.setup_error is None:
            return None
        text = f"The task could not be set up ({self.setup_error}); the sample ends."
        message = tool_message(call_id, name, text) if call_id else {"role": "user", "content": text}
        return StepResult(messages=[message], done=True, reward=0.0, status=Status.COMPLETED,
                          metrics=self._metrics(0.0))

    def bash(self, script: str, timeout: float | None = None) -> CommandResult:
        result = self.shell.run(script, timeout)
        self.last_output = result.output
        self.ran_example = self.ran_example or script == self.example
        return result

    def step(self, action: Action) -> StepResult:
        self.steps += 1
        first = action.tool_calls[0]
        ended = self._setup_failed(first.id, first.name)
        if ended is not None:
            return ended
        self.deadline = self._message_deadline()
        # One action per message, as the prompt says and AgentBench-FC does: more calls would multiply the
        # round limit. The others are answered, not run.
        messages = [tool_message(c.id, c.name, ONE_CALL) for c in action.tool_calls[1:]]
        if first.name == "bash_action":
            left = min(self.cfg.command_timeout_s, self.deadline - time.monotonic())
            if left < 0.5:
                return StepResult(messages=[tool_message(first.id, first.name, "Error: this message's time is "
                                                         "spent; the command did not run."), *messages],
                                  metrics=self._metrics(0.0))
            result = self.bash(first.arguments["script"], left)
            return StepResult(messages=[tool_message(first.id, first.name, format_output(result, left)), *messages],
                              metrics=self._metrics(0.0))
        answer = first.arguments["answer"] if first.name == "answer_action" else None
        reward = 1.0 if self.judge(answer) else 0.0
        text = "Your answer has been recorded." if answer is not None else "The task has been marked as finished."
        return self.verdict([tool_message(first.id, first.name, text), *messages], reward)

    def _message_deadline(self) -> float:
        """When this message's work must be done: the agent's budget for it (`envs.message_budget_s`, which
        the worker sets around each message: `agentrl.tasks.api.message_deadline`). One message's time holds
        its bash call (at most `sandbox.command_timeout_s` of what is left) and the grading of its answer
        (the check scripts share the rest), so that a session that makes its commands or its graders slow (a
        FIFO where a check reads a file) ends by this task's rule, never as the worker's env_error. Outside a
        session (a test calling `step`) there is none: a command gets `command_timeout_s`, a check script
        `SCRIPT_TIMEOUT_S`."""
        return message_deadline()

    def verdict(self, messages: list[dict[str, Any]], reward: float) -> StepResult:
        """The episode's end after a judged answer: `grader_failed` when a grader could not finish."""
        if self.grader_failure is not None:
            log.info("os grader failed (the agent's state): %s", self.grader_failure)
            return StepResult(messages=messages, done=True, reward=0.0, status=Status.GRADER_FAILED,
                              metrics={**self._metrics(0.0), "grader_failed": 1.0})
        return StepResult(messages=messages, done=True, reward=reward, status=Status.COMPLETED,
                          metrics=self._metrics(reward))

    def _metrics(self, success: float) -> dict[str, float]:
        return {"success": success, "setup_failed": float(self.setup_error is not None)}

    def judge(self, answer: str | None) -> bool:
        """Strict evaluation of a committed answer (None: finish_action, no answer)."""
        p = self.problem
        if p.match is not None:
            if answer is None:
                return False
            return self._match(answer.strip() if p.match.get("strip") else answer)
        return self._check(["" if answer is None else answer])

    def _match(self, answer: str) -> bool:
        assert self.problem.match is not None
        if "answer" in self.problem.match:
            return answer == self.problem.match["answer"]
        if "regex" in self.problem.match:
            return re.search(str(self.problem.match["regex"]), answer) is not None
        return False

    def _check(self, params: list[str]) -> bool:
        """AgentBench's check scripts, each a grader process the agent's processes cannot touch."""
        p = self.problem
        for script in p.check or []:
            if script is None:
                script = p.example
            if script is None:  # a `null` check with no example: nothing to compare against
                return False
            shell = self.shell  # made now if it was not (its reference with it)
            if script is p.example and self.reference is not None:  # computed before the agent acted
                r = self.reference
            else:
                left = self.deadline - time.monotonic()
                if left < 0.5:
                    self.grader_failure = "no time was left for the check scripts"
                    return False
                r = shell.run_independent(script_argv(script, params), timeout=min(left, SCRIPT_TIMEOUT_S), freeze=True)
            if r.timed_out or (r.exit_code == 126 and r.output.startswith("agentrl:")):
                self.grader_failure = f"a check script {'ran out of time' if r.timed_out else r.output[:200]}"
                return False
            if r.exit_code != 0:
                return False
            params.append(r.output)
        return bool(p.check)

    def expert_message(self) -> dict[str, Any]:
        # A function of the episode's state, not of how often it is asked: asking twice gives one move.
        turn, p = self.steps, self.problem
        if not self.skilled:
            return self._unskilled(turn)
        if self.example is not None and not self.ran_example:
            return call_message([("bash_action", {"script": self.example})], turn)
        if p.match is not None and "answer" in p.match:
            return call_message([("answer_action", {"answer": str(p.match["answer"])})], turn)
        if p.match is not None or (p.check and None in p.check):
            return call_message([("answer_action", {"answer": self.last_output.strip()})], turn)
        if self.ran_example and self.last_output.strip():  # an operation whose check also reads an answer
            return call_message([("answer_action", {"answer": self.last_output.strip()})], turn)
        return call_message([("finish_action", {"thought": "The operation is done."})], turn)

    def _unskilled(self, turn: int) -> dict[str, Any]:
        """The unskilled expert's only move: a question answered by a guess, an operation declared done, both
        before any command, so that the sample's state is as its setup left it."""
        p = self.problem
        _ = self.shell  # made here, not in the answer's step: a slow setup must not spend the grader's time
        if p.match is None and not (p.check and None in p.check):
            return call_message([("finish_action", {"thought": "The operation is done."})], turn)
        if self._guess is None:
            self._guess = self.guess()
        return call_message([("answer_action", {"answer": self._guess})], turn)

    def guess(self) -> str:
        """A wrong answer: the first of `GUESSES` that a `match` rejects, or that differs from the example's
        output on the untouched sample (a guess equal to it would pass any check that compares the two)."""
        p = self.problem
        if p.match is not None:
            strip = bool(p.match.get("strip"))
            wrong = [a for a in GUESSES if not self._match(a.strip() if strip else a)]
        else:
            reference = self.reference
            if reference is None and p.example is not None and self.setup_error is None:
                # example_state "end": the grader runs it after the answer, on this same untouched state
                reference = self.shell.run_independent(script_argv(p.example, []), timeout=SCRIPT_TIMEOUT_S,
                                                       freeze=True)
            output = reference.output.strip() if reference is not None else None
            wrong = [a for a in GUESSES if a != output]
        if not wrong:
            raise ValueError(f"os: every guess of the unskilled expert is the sample's answer ({GUESSES})")
        return wrong[0]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._shell is not None:
            self._shell.close()
            if self.budget is not None:
                self.budget.release(self.slot)


class FaithfulOsEpisode(OsEpisode):
    """AgentBench-FC's protocol (`faithful`): the first call only, its arguments unchecked
    (`CallPolicy`, applied by `Session`), read here as AgentBench reads them."""

    call_policy = CallPolicy(first_call_only=True, lenient_arguments=True)

    def __init__(self, problem: OsProblem, sandbox: SandboxConfig, prompts: ab.OsPrompts,
                 budget: SessionBudget | None = None, example_state: str = "end", skilled: bool = True) -> None:
        super().__init__(problem, sandbox, budget, example_state, skilled)
        self.prompts = prompts

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.prompts.system_prompt},
                {"role": "user", "content": self.prompts.user_prompt(self.problem.description)}]

    def text_step(self, content: str) -> StepResult:
        """A message without a tool call: AgentBench's reminder; the round is used."""
        self.steps += 1
        return StepResult([{"role": "user", "content": ab.NO_CALL}], metrics=self._metrics(0.0))

    def step(self, action: Action) -> StepResult:
        self.steps += 1
        first = action.tool_calls[0]
        if first.error is not None and "too long" in first.error:  # the worker's bound, not AgentBench's
            act = ab.RawAction("error", first.id, first.name, text=first.error)
        else:
            act = ab.parse_action(action.message)  # the same first call, read from the raw message
        call_id = first.id
        if act.kind == "error":
            return StepResult([tool_message(call_id, act.name, act.text)], metrics=self._metrics(0.0))
        if act.kind == "invalid":
            return StepResult([tool_message(call_id, act.name, ab.INVALID_CALL)], metrics=self._metrics(0.0))
        ended = self._setup_failed(call_id, act.name)
        if ended is not None:
            return ended
        if act.kind == "crash":  # AgentBench's task raises here: the sample ends as a task error, failed
            return StepResult([tool_message(call_id, act.name, "Error: the call has no arguments.")],
                              done=True, reward=0.0, status=Status.INVALID_ACTION, metrics=self._metrics(0.0))
        self.deadline = self._message_deadline()
        if act.kind == "bash":
            # AgentBench runs nothing for a non-string script and shows an empty output.
            output = self.bash(act.content).output if isinstance(act.content, str) else ""
            return StepResult([tool_message(call_id, act.name, ab.observation(output))], metrics=self._metrics(0.0))
        reward = 1.0 if self.judge_faithful(act.content) else 0.0
        # AgentBench answers a commit with no tool message: the episode ends.
        return self.verdict([], reward)

    def judge_faithful(self, answer: Any) -> bool:
        """AgentBench's `_evaluate_answer`: strip only strings; a check gets `str(answer)` ("None" too)."""
        p = self.problem
        if p.match is not None:
            if isinstance(answer, str) and p.match.get("strip"):
                answer = answer.strip()
            if "regex" in p.match and not isinstance(answer, str):
                return False  # AgentBench's re.search raises: a task error, not a pass
            return self._match(answer) if isinstance(answer, str) else False
        return self._check([str(answer)])


EXAMPLE_STATES = ("start", "end")
"""Where a `null` check's example script runs. "start": once, as a grader, right after the sample's init
and start scripts, before the agent acts: the reference answer is the sample's, so deleting or shrinking
what it counts earns nothing (the default of the strict protocol, which trains). "end": after the
agent's answer, on the state it left, as AgentBench does (the faithful protocol's default, whose score
must be comparable with AgentBench's; docs/tasks.md lists the holes it keeps)."""
DEFAULT_FILES = {"train": "os/train.json", "test": "os/test.json"}
OUR_DEV = ("agentbench/os_interaction/dev.json", "agentbench/os_interaction/scripts/dev")  # under data/
AGENTBENCH_DEV = ("data/os_interaction/data/dev.json", "data/os_interaction/scripts/dev")  # in a checkout
AGENTBENCH_SPLITS = {
    "train": [("data/os_interaction/train_0317/training.json", "data/os_interaction/scripts/7")],
    "test": [(f"data/os_interaction/data/{n}/*.json", f"data/os_interaction/scripts/{n}") for n in range(1, 8)],
}


class OsTask:
    """The `os` task.

    Args:
        source: "ours" (train/test generated by this project) or "agentbench" (AgentBench's train/test,
            which needs a checkout).
        agentbench_dir: an AgentBench checkout (default `AGENTRL_AGENTBENCH_DIR`); "dev" then comes from
            it, else from this project's copy in `data/agentbench/`.
        data_dir: this project's data folder (default `data/`).
        sandbox: a `SandboxConfig` or a mapping of its fields (backend, image, command_timeout_s, ...).
            `image` is the root file system (default `~/.cache/agentrl/rootfs/os-bookworm`, for root
            `/var/cache/agentrl/rootfs/os-bookworm`; `python -m jobs.make_rootfs` builds it).
        protocol: "strict" or "faithful" (default: faithful with source="agentbench", else strict).
        slots: sessions the serving worker may hold; checked against the host's PID budget now.
        example_state: "start" or "end" (`EXAMPLE_STATES`; default: "start" in the strict protocol, "end"
            in the faithful one).
    """

    name = "os"
    Options = OsOptions  # what `envs.task_options.os` may hold, checked at load
    max_turns = MAX_ROUNDS
    blocking = True
    isolation = "thread"
    """Its work runs in the session's sandbox; the live-sandbox count is the task's, shared by sessions."""

    def __init__(self, source: str = "ours", agentbench_dir: str | Path | None = None,
                 data_dir: str | Path | None = None, sandbox: SandboxConfig | dict[str, Any] | None = None,
                 protocol: str | None = None, slots: int | None = None, example_state: str | None = None,
                 expert_skill: float = 1.0) -> None:
        self.expert_skill = checked_skill("os", expert_skill)
        if source not in ("ours", "agentbench"):
            raise ValueError(f"os: unknown source {source!r} (ours | agentbench)")
        self.protocol = resolve_protocol(protocol, source == "agentbench", "os")
        self.example_state = example_state or ("end" if self.protocol == "faithful" else "start")
        if self.example_state not in EXAMPLE_STATES:
            raise ValueError(f"os: unknown example_state {self.example_state!r} ({' | '.join(EXAMPLE_STATES)})")
        root = Path(data_dir) if data_dir else data_root()
        checkout = Path(agentbench_dir) if agentbench_dir else env_path("AGENTRL_AGENTBENCH_DIR")
        self.sandbox = sandbox if isinstance(sandbox, SandboxConfig) else SandboxConfig(**(sandbox or {}))
        self.backend = select_backend(self.sandbox.backend, self.sandbox.isolation)  # a missing sandbox fails here
        check_image(self.sandbox, self.backend)  # and so does a missing root file system
        self.budget = SessionBudget(session_budget(self.sandbox))
        if slots is not None:
            self.check_slots(slots)
        if (source == "agentbench" or self.protocol == "faithful") and checkout is None:
            raise ValueError(f"os: source={source!r} with protocol={self.protocol!r} needs agentbench_dir "
                             f"or AGENTRL_AGENTBENCH_DIR (an AgentBench checkout)")
        self.prompts = ab.load_prompts(checkout) if self.protocol == "faithful" and checkout else None
        self.problems: dict[str, list[OsProblem]] = {}
        if source == "ours":
            for split, file in DEFAULT_FILES.items():
                self.problems[split] = load_problems(root / file, None)
        else:
            assert checkout is not None
            for split, patterns in AGENTBENCH_SPLITS.items():
                found = _load_globs(checkout, patterns)
                if found:  # a split whose files are missing is left out, the others still load
                    self.problems[split] = found
            if not self.problems:
                raise FileNotFoundError(f"os: {checkout} holds none of AgentBench's os files "
                                        f"({[p for ps in AGENTBENCH_SPLITS.values() for p, _ in ps]})")
        dev = (checkout / AGENTBENCH_DEV[0], checkout / AGENTBENCH_DEV[1]) if checkout else None
        if dev is None or not dev[0].is_file():
            dev = (root / OUR_DEV[0], root / OUR_DEV[1])
        self.problems["dev"] = load_problems(*dev)
        self.sizes = {split: len(p) for split, p in self.problems.items()}

    def check_slots(self, slots: int) -> None:
        """Fail (ValueError) when `slots` sandboxes could exhaust a host-wide table (`os(slots=...)`'s check)."""
        check_slots(self.sandbox, slots)

    def session_cap(self) -> int:
        """Sandboxes this host holds at once: the least its pid, file and pty tables allow (`session_budget`).
        A worker with more slots holds at most this many os sessions and answers further starts no_capacity."""
        return self.budget.limit

    def session_cap_why(self) -> str:
        """Which host table sets `session_cap`, and how."""
        return "; ".join(f"{name} {n}: {why}" for name, (n, why) in budgets(self.sandbox).items())

    def tools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.prompts.tools if self.prompts else TOOLS)

    def indices(self, split: str) -> list[str]:
        return split_indices(self.name, split, self.sizes)

    def start(self, index: str) -> OsEpisode:
        split, i = split_index(self.name, index, self.sizes)
        skilled = expert_skilled(self.name, index, self.expert_skill)
        if self.prompts is not None:
            return FaithfulOsEpisode(self.problems[split][i], self.sandbox, self.prompts, self.budget,
                                     self.example_state, skilled)
        return OsEpisode(self.problems[split][i], self.sandbox, self.budget, self.example_state, skilled)


def _load_globs(checkout: Path, patterns: list[tuple[str, str]]) -> list[OsProblem]:
    problems: list[OsProblem] = []
    for pattern, scripts in patterns:
        for file in sorted(glob.glob(str(checkout / pattern))):
            problems += load_problems(Path(file), checkout / scripts)
    return problems
