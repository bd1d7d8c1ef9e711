"""`bfcl`: the multi-turn categories of the Berkeley Function Calling Leaderboard, as an evaluation task.

Data, executable backends and grading are those the `bfcl-eval` package ships (installed without its
pinned dependencies, which would break the training environment: `pip install --no-deps
bfcl-eval==2026.3.23 mpmath`, as install.sh does). Categories: `multi_turn_base` (default, 200 cases)
and `multi_turn_long_context` (the same mechanics over larger initial states); `multi_turn_miss_param`
works the same way. `multi_turn_miss_func` is refused: it adds tools in the middle of an episode,
which this environment API does not do.

An episode is one case. Its tools are the functions of the classes it involves (`involved_classes`:
GorillaFileSystem, TwitterAPI, TradingBot, ...), BFCL's function docs converted to OpenAI schemas
(BFCL's type names mapped to JSON Schema's: dict -> object, float -> number, tuple -> array,
any -> string). The conversation starts with the first user turn; as in BFCL's FC inference loop, each
assistant message with tool calls is executed (on this episode's own instances of the backend
classes, loaded with the case's `initial_config`; a result is the method's return value, dicts as
JSON, an exception as "Error during execution: ..."), and a message without tool calls ends the user
turn: the next turn's user message follows, and after the last turn the episode is graded. More than
20 steps in one turn ends the episode as BFCL's force-quit (status "turn_limit", reward 0).

Grading: bfcl-eval's `multi_turn_checker` (after every turn, the state of each backend instance
must equal the ground truth's, and the ground truth's execution results must all appear among the
model's), on the calls the model made, per turn and step, in BFCL's decoded form `name(k=repr(v))`.
Reward 1.0 when the whole case passes, else 0.0; status "completed"; metrics {"success",
"turns_passed" (the longest prefix of turns that passes), "turns"}.

Splits: "test" only (`test-<i>`, the categories' cases in order); this task is for evaluation, and
`indices("train")` says so. The scripted expert replays the ground truth: all of a turn's calls in
one message, then a message without calls.
"""
from __future__ import annotations

import ast
import copy
import inspect
import itertools
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema

from agentrl.tasks.api import Action, EnvError, StepResult, tool_message
from agentrl.tasks.options import BfclOptions
from agentrl.tasks.shared import import_optional, text_message
from agentrl.types import Status

INSTALL = "pip install --no-deps bfcl-eval==2026.3.23 mpmath"
CATEGORIES = ("multi_turn_base", "multi_turn_long_context", "multi_turn_miss_param")
MAX_STEPS_PER_TURN = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT
TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string", "list": "array",
         "bool": "boolean", "int": "integer", "double": "number", "long": "integer", "short": "integer",
         "byte": "integer", "char": "string", "HashMap": "object", "ArrayList": "array", "Array": "array"}
_names = itertools.count()


def _bfcl() -> ModuleType:
    return import_optional("bfcl_eval", INSTALL, "bfcl")


def to_json_schema(spec: dict[str, Any]) -> dict[str, Any]:
    """A BFCL parameter spec as JSON Schema: its type names mapped, nested properties and items too."""
    out = dict(spec)
    if isinstance(out.get("type"), str):
        out["type"] = TYPES.get(out["type"], out["type"])
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: to_json_schema(v) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = to_json_schema(out["items"])
    return out


def to_tool(doc: dict[str, Any]) -> dict[str, Any]:
    params = to_json_schema(doc.get("parameters") or {"type": "object", "properties": {}})
    params["type"] = "object"
    return {"type": "function", "function": {"name": doc["name"], "description": doc.get("description", ""),
                                             "parameters": params}}


def decoded_call(name: str, arguments: dict[str, Any]) -> str:
    """BFCL's decoded form of a function call (what its FC handlers produce): `name(k=repr(v),...)`."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def parse_call(text: str, signatures: dict[str, inspect.Signature]) -> tuple[str, dict[str, Any]]:
    """A ground-truth call string ("sort('a.pdf')", "cd(folder='x')") as (name, keyword arguments)."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a function call: {text!r}")
    name = node.func.id
    args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    if node.args:
        params = [p for p in signatures[name].parameters if p != "self"]
        for param, value in zip(params, node.args):
            args[param] = ast.literal_eval(value)
    return name, args


class Backends:
    """One episode's instances of the classes a case involves, and their public methods by name."""

    def __init__(self, case: dict[str, Any], long_context: bool) -> None:
        _bfcl()  # a clear error when bfcl-eval is missing
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        self.methods: dict[str, Any] = {}
        for cls_name in case["involved_classes"]:
            module = import_optional(CLASS_FILE_PATH_MAPPING[cls_name], INSTALL, "bfcl")
            instance = getattr(module, cls_name)()
            if cls_name not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(case.get("initial_config", {}).get(cls_name, {})),
                                        long_context=long_context)
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = method

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        try:
            return self._text(self.methods[name](**arguments))
        except Exception as e:  # noqa: BLE001 - BFCL shows the model any exception of a backend
            return f"Error during execution: {e}"

    @staticmethod
    def _text(result: Any) -> str:
        """A backend's return value as the model sees it; one that cannot be written as text (`power(10, 5000)`:
        Python refuses to print an integer of more than 4,300 digits) raises, and `call` shows the error."""
        if isinstance(result, str):
            return result
        if isinstance(result, dict):
            try:
                return json.dumps(result)
            except (TypeError, ValueError):
                return str(result)
        return str(result)


def check(decoded: list[list[list[str]]], ground_truth: list[list[str]], case: dict[str, Any],
          category: str) -> dict[str, Any]:
    """bfcl-eval's multi_turn_checker on one case, leaving no instance behind in its module globals."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    name = f"agentrl_{next(_names)}"  # the checker caches instances in globals under the model name
    try:
        result: dict[str, Any] = multi_turn_checker(decoded, ground_truth, case, category, name)
        return result
    finally:
        names = vars(multi_turn_utils)
        for key in [k for k in list(names) if k.startswith(name)]:  # list(): one step under the GIL, as
            names.pop(key, None)                                       # other sessions' checks add names


class BfclEpisode:
    def __init__(self, case: dict[str, Any], ground_truth: list[list[str]], tools: list[dict[str, Any]],
                 category: str) -> None:
        self.case, self.ground_truth, self._tools, self.category = case, ground_truth, tools, category
        self.backends = Backends(case, long_context="long_context" in category)
        self.signatures = {n: inspect.signature(m) for n, m in self.backends.methods.items()}
        self.turn = 0
        self.steps: list[list[list[str]]] = [[]]  # per user turn, per step: the decoded calls executed

    def tools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self._tools)

    def _valid(self, name: str, arguments: dict[str, Any]) -> bool:
        if not hasattr(self, "_validators"):
            self._validators = {t["function"]["name"]: jsonschema.Draft202012Validator(t["function"]["parameters"])
                                for t in self._tools}
        return name in self._validators and self._validators[name].is_valid(arguments)

    def initial_messages(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self.case["question"][0]]

    def step(self, action: Action) -> StepResult:
        messages, executed = [], []
        for call in action.tool_calls:
            messages.append(tool_message(call.id, call.name, self.backends.call(call.name, call.arguments)))
            executed.append(decoded_call(call.name, call.arguments))
        self.steps[self.turn].append(executed)
        if len(self.steps[self.turn]) > MAX_STEPS_PER_TURN:
            note = {"role": "user", "content": f"Model has been forced to quit after {MAX_STEPS_PER_TURN} steps."}
            return StepResult(messages + [note], done=True, status=Status.TURN_LIMIT,
                              metrics={"success": 0.0, "turns_passed": 0.0, "turns": float(len(self.ground_truth))})
        return StepResult(messages, metrics={"success": 0.0})

    def text_step(self, content: str) -> StepResult:
        """A message without tool calls ends the user turn: the next turn, or the grading."""
        self.turn += 1
        if self.turn < len(self.case["question"]):
            self.steps.append([])
            return StepResult([dict(m) for m in self.case["question"][self.turn]], metrics={"success": 0.0})
        n = len(self.ground_truth)
        passed = n if check(self.steps, self.ground_truth, self.case, self.category)["valid"] else 0
        for k in range(1, n if passed < n else 1):  # a failed case: how many turns passed before it failed
            if not check(self.steps[:k], self.ground_truth[:k], self.case, self.category)["valid"]:
                break
            passed = k
        success = float(passed == len(self.ground_truth))
        return StepResult([], done=True, reward=success, status=Status.COMPLETED,
                          metrics={"success": success, "turns_passed": float(passed),
                                   "turns": float(len(self.ground_truth))})

    def expert_message(self) -> dict[str, Any]:
        """The ground truth's calls of this turn in one message, then a message without calls.

        A ground-truth call whose arguments fail the function's own schema (BFCL has one: a string
        ticket id for an integer parameter) is left out: this environment refuses such a call, so the
        replay cannot make it, and the case fails its check as a model's would.
        """
        gold = self.ground_truth[self.turn] if self.turn < len(self.ground_truth) else []
        calls = [c for c in (parse_call(c, self.signatures) for c in gold) if self._valid(*c)]
        if calls and not self.steps[self.turn]:
            return {"role": "assistant", "content": "", "tool_calls": [
                {"id": f"call_{self.turn}_{i}", "type": "function",
                 "function": {"name": n, "arguments": json.dumps(a)}} for i, (n, a) in enumerate(calls)]}
        return text_message("Done.")


class BfclTask:
    """The `bfcl` task (evaluation only).

    Args:
        categories: BFCL multi-turn categories to serve, in order (default: multi_turn_base).
        data_dir: a folder with BFCL's files (`BFCL_v4_<category>.json`, `possible_answer/`,
            `multi_turn_func_doc/`); default: the data bfcl-eval ships.
    """

    name = "bfcl"
    Options = BfclOptions  # what `envs.task_options.bfcl` may hold, checked at load
    max_turns = 7 * (MAX_STEPS_PER_TURN + 1)  # the longest case has 7 user turns
    splits = ("test",)
    blocking = True  # loading a case's backends and grading it re-execute every call: tens of milliseconds

    def __init__(self, categories: list[str] | tuple[str, ...] = ("multi_turn_base",),
                 data_dir: str | Path | None = None) -> None:
        bfcl = _bfcl()
        from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

        root = Path(data_dir) if data_dir else Path(bfcl.__file__).parent / "data"
        self.cases: list[tuple[dict[str, Any], list[list[str]], str]] = []
        for category in categories:
            if category not in CATEGORIES:
                raise ValueError(f"bfcl: category {category!r} is not served (served: {', '.join(CATEGORIES)})")
            answer_file = root / "possible_answer" / f"BFCL_v4_{category}.json"
            answers = {a["id"]: a["ground_truth"] for a in _jsonl(answer_file)}
            for case in _jsonl(root / f"BFCL_v4_{category}.json"):
                self.cases.append((case, answers[case["id"]], category))
        self.docs: dict[str, list[dict[str, Any]]] = {
            cls: [to_tool(d) for d in _jsonl(root / "multi_turn_func_doc" / file)]
            for cls, file in MULTI_TURN_FUNC_DOC_FILE_MAPPING.items()
            if cls in {c for case, _, _ in self.cases for c in case["involved_classes"]}}

    def tools(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(t) for docs in self.docs.values() for t in docs]

    def indices(self, split: str) -> list[str]:
        if split != "test":
            raise EnvError("bad_request", f"bfcl is an evaluation task: its only split is 'test', not {split!r}")
        return [f"test-{i}" for i in range(len(self.cases))]

    def start(self, index: str) -> BfclEpisode:
        split, _, num = index.rpartition("-")
        if split != "test" or not num.isdigit() or num != str(int(num)) or int(num) >= len(self.cases):
            raise EnvError("bad_request", f"bfcl has no sample {index!r}")
        case, truth, category = self.cases[int(num)]
        tools = [t for cls in case["involved_classes"] for t in self.docs[cls]]
        return BfclEpisode(copy.deepcopy(case), truth, tools, category)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(f"bfcl: {path} not found")
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]
