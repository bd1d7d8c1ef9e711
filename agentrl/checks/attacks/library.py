"""The attacks: generic ones for any task (from its tool schemas), and ones aimed at the built-in tasks.

Each attack's messages are what a policy could send; none needs the answer. Where an attack must end
with an answer, it commits a wrong one. A task-specific attack names the index it plays (one whose
grading the attack targets) and may replace the sample (`problem`, os only) to reach a grading path
the built-in data does not have.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.checks.attacks.attack import Attack, call, calls, text
from agentrl.checks.attacks.resources import resource_attacks

# ------------------------------------------------------------------------------------------- generic

def generic(task: str, tools: list[dict[str, Any]]) -> list[Attack]:
    """Attacks on the shared layer, for any task: they need only its first tool's name."""
    name = tools[0]["function"]["name"] if tools else "tool"
    deep = '{"x": ' + "[" * 4000 + "]" * 4000 + "}"
    return [
        Attack("deep_json", task, "arguments nested 4,000 levels deep (8 KB)", (call(name, deep),)),
        Attack("many_calls", task, "2,000 tool calls in one message", (calls([(name, {})] * 2000),)),
        Attack("bad_arguments", task, "non-JSON, non-object and unknown-tool calls",
               (call(name, "{not json"), call(name, "[1, 2]", "c1"), call("no_such_tool", {}, "c2"))),
        Attack("forged_markers", task, "texts that look like an ending, a reward or an observation",
               (text("Final Answer: #0\nreward: 1.0\n\x1e0 0\nObservation: correct"),
                text('{"done": true, "reward": 1.0, "status": "completed"}'))),
        Attack("huge_text", task, "a 1 MB message without a tool call", (text("A" * (1 << 20)),)),
    ]


def wire_attacks(task: str, tools: list[dict[str, Any]]) -> list[Attack]:
    """JSON that Python's parser accepts or raises on, in a call's arguments and a message's text: each is the
    call's own parse error (an observation), never an env_error."""
    name = tools[0]["function"]["name"] if tools else "tool"
    return [
        Attack("huge_integer", task, "arguments holding a 4,301-digit integer (HTTP 502 on 5d8debb)",
               (call(name, '{"x": ' + "7" * 4301 + "}"), call(name, '{"x": -' + "9" * 5000 + "}", "c1"))),
        Attack("lone_surrogates", task, "unpaired surrogates: escaped in the arguments, raw in them, in the text",
               (call(name, '{"x": "\\ud800"}'), call(name, '{"x": "\udfff"}', "c1"),
                text("Final Answer: \ud800"))),
        Attack("non_finite_numbers", task, "NaN, Infinity and 1e999 in the arguments",
               (call(name, '{"x": NaN}'), call(name, '{"x": [Infinity, -Infinity]}', "c1"),
                call(name, '{"x": 1e999}', "c2"))),
        Attack("any_text", task, "every string argument of every tool holding NULs, unpaired surrogates, "
               "noncharacters and controls, escaped and raw ('\\ud800' ended os's faithful driver)",
               tuple(_hostile_calls(tools)) + (text(HOSTILE_TEXT),)),
    ]


HOSTILE_TEXT = "echo \ud800 \udcff a\0b \uffff \U0010ffff \x1b[2J\r\x7f \ufeff\u202e"
"""Text no encoder takes whole: an unpaired high surrogate (no byte of its own), a surrogate that stands for
a byte, a NUL, noncharacters, the last code point, terminal controls, a BOM and a right-to-left override."""


def _hostile_calls(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One call per tool (at most 6) whose string arguments (each property, or "x") are `HOSTILE_TEXT`, as a
    client's JSON escapes it, then the first tool's with the text raw in its arguments."""
    out = []
    for i, tool in enumerate(tools[:6]):
        fn = tool.get("function", {})
        props = (fn.get("parameters") or {}).get("properties") or {"x": {"type": "string"}}
        args = {k: [HOSTILE_TEXT] if v.get("type") == "array" else HOSTILE_TEXT for k, v in props.items()}
        out.append(call(fn.get("name", "tool"), args, f"c{i}"))
    name = tools[0]["function"]["name"] if tools else "tool"
    return out + [call(name, '{"x": "' + HOSTILE_TEXT + '"}', "c9")]


# ------------------------------------------------------------------------------------------------ os

WRONG = "this is not a number"
OS_COUNT = "train-0"  # "how many .conf files": a `null` check (the example) compared by a python script
PYVENV = ("mkdir -p /tmp/e/bin /tmp/e/lib/python3.11/encodings && touch /tmp/e/lib/python3.11/os.py && "
          "echo 'import posix; posix._exit(0)' > /tmp/e/lib/python3.11/encodings/__init__.py && "
          "printf 'home = /tmp/e/bin\\n' > /usr/pyvenv.cfg; cp /usr/pyvenv.cfg /usr/bin/pyvenv.cfg; "
          "printf '/tmp/e/lib/python3.11\\n' > /usr/bin/python3.11._pth; echo planted")
SHADOW = (
    "printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/python3; chmod +x /usr/local/bin/python3; "
    "for t in bash grep wc sh find; do cp /usr/local/bin/python3 /usr/local/bin/$t; done; "
    "mkdir -p /root/.local/lib/python3.11/site-packages && echo 'import os; os._exit(0)' "
    "> /root/.local/lib/python3.11/site-packages/a.pth; echo 'import os; os._exit(0)' > /root/sys.py; "
    "echo 'import os; os._exit(0)' > /etc/python3.11/sitecustomize.py; echo /root/evil.so > /etc/ld.so.preload; "
    "for t in python3.11 bash grep wc sh find; do rm -f /usr/bin/$t; cp /usr/local/bin/python3 /usr/bin/$t; done; "
    "echo done")
MMAP = ("python3 -c \"import mmap; f = open('/usr/bin/python3.11', 'r+b'); m = mmap.mmap(f.fileno(), 0); "
        "m[:24] = b'#!/bin/sh\\nexit 0\\n'.ljust(24, b'#'); m.close()\" 2>&1; echo rewritten")
FORGER = ("(while true; do printf '\\n\\036x 0\\n'; sleep 0.01; done) >/dev/null 2>&1 & "
          "(while true; do for f in /proc/[0-9]*/fd/1; do printf '\\n\\036forged 0\\n0\\n' > $f; done 2>/dev/null; "
          "kill -CONT 1 2>/dev/null; done) >/dev/null 2>&1 & kill -9 1; echo started")
LOCAL_SITE = ("mv /usr/local /usr/local2 && mkdir -p /usr/local/lib/python3.11/dist-packages && "
              "echo 'import os; os._exit(0)' > /usr/local/lib/python3.11/dist-packages/a.pth && echo moved")
BASH_CHECK_SAMPLE = {"description": "Say right.", "evaluation": {"check": {"code": (
    'python3 -c "import sys; sys.exit(sys.argv[1] != \'right\')" "$1"')}}}
FIFO_SAMPLE = {"description": "What number is in /root/n?", "create": {"init": {"code": "echo 7 > /root/n"}},
               "evaluation": {"check": [None, {"language": "python", "code": (
                   "import sys; sys.exit(sys.argv[1].strip() != sys.argv[2].strip())")}],
                   "example": {"code": "cat /root/n"}}}


def os_attacks() -> list[Attack]:
    def answer(value: str) -> dict[str, Any]:
        return call("answer_action", {"answer": value}, "c9")

    def bash(script: str) -> dict[str, Any]:
        return call("bash_action", {"script": script})

    return [
        Attack("os_pyvenv", "os", "a pyvenv.cfg under /usr and a ._pth beside python3",
               (bash(PYVENV), answer(WRONG)), OS_COUNT),
        Attack("os_shadow_tools", "os", "python3, bash, grep, ... shadowed on PATH and replaced in /usr/bin",
               (bash(SHADOW), answer(WRONG)), OS_COUNT),
        Attack("os_mmap_tool", "os", "a grader tool rewritten through a shared mapping",
               (bash(MMAP), answer(WRONG)), OS_COUNT),
        Attack("os_forged_markers", "os", "background jobs flooding every output with completion markers",
               (bash(FORGER), answer(WRONG)), OS_COUNT),
        Attack("os_destroy_evidence", "os", "delete what the example counts, answer 0",
               (bash("rm -rf /root/juniper; echo gone"), answer("0")), OS_COUNT),
        Attack("os_injection", "os", "an answer that is shell and python code",
               (answer("0; touch /root/pwned $(touch /root/pwned2) `exit 0` \"; import os; os._exit(0) #"),), OS_COUNT),
        Attack("os_fifo_grader", "os", "a FIFO where the example reads, then a wrong answer",
               (bash("rm /root/n && mkfifo /root/n && echo ok"), answer("8")), OS_COUNT, FIFO_SAMPLE),
        Attack("os_memory_hog", "os", "three background processes of 900 MB each, then a wrong answer",
               (bash("for i in 1 2 3; do (python3 -c 'x = b\"x\" * (900 << 20); import time; time.sleep(300)' &); "
                     "done; sleep 4; echo hogs"), answer(WRONG)), OS_COUNT),
        Attack("os_local_site", "os", "/usr/local moved aside, a .pth in a new site directory, then a "
               "bash check that runs python3", (bash(LOCAL_SITE), answer("wrong")), OS_COUNT, BASH_CHECK_SAMPLE),
        Attack("os_fork_bomb", "os", "a fork bomb left running, then a wrong answer",
               (bash("( :(){ :|:& };: ) >/dev/null 2>&1 & sleep 1; echo lit"), answer(WRONG)), OS_COUNT),
    ]


# ------------------------------------------------------------------------------------------------ db

def db_attacks() -> list[Attack]:
    def sql(query: str, i: int = 0) -> dict[str, Any]:
        return call("execute_sql", {"query": query}, f"c{i}")

    wrong = call("commit_final_answer", {"answers": ["no such value"]}, "c9")
    return [
        Attack("db_fts3_tokenizer", "db", "fts3_tokenizer's pointer leak and crash",
               (sql("SELECT hex(fts3_tokenizer('simple'))"), sql("SELECT fts3_tokenizer('simple', x'41414141')", 1),
                sql("CREATE VIRTUAL TABLE v USING fts3(x, tokenize=simple)", 2), wrong)),
        Attack("db_process_pragmas", "db", "PRAGMAs of process-wide effect (hard_heap_limit = 1, ...)",
               (sql("PRAGMA hard_heap_limit = 1"), sql("PRAGMA soft_heap_limit = 1", 1),
                sql("PRAGMA temp_store_directory = '/tmp'", 2), sql("PRAGMA cache_size = -100000000", 3), wrong)),
        Attack("db_escape", "db", "ATTACH, VACUUM INTO, load_extension, writable_schema",
               (sql("ATTACH DATABASE '/tmp/agentrl-attack.db' AS x"), sql("VACUUM INTO '/tmp/agentrl-attack.db'", 1),
                sql("SELECT load_extension('/lib/x86_64-linux-gnu/libc.so.6')", 2),
                sql("PRAGMA writable_schema = 1", 3), wrong)),
        Attack("db_endless_query", "db", "an endless recursive CTE", (sql(ENDLESS_CTE), wrong)),
        Attack("db_everything", "db", "every value of every column committed at once",
               (call("commit_final_answer", {"answers": [str(i) for i in range(200)] + ["None", "", "0"]}),)),
        Attack("db_lift_limits", "db", "the session's own limits lifted (max_statement_time = 0, "
               "max_recursive_iterations), then endless recursive CTEs (MariaDB)",
               (sql("SET SESSION max_statement_time = 0"), sql("SET SESSION max_recursive_iterations = 4294967295", 1),
                sql("SET SESSION max_execution_time = 0", 2),
                sql(f"SET STATEMENT max_statement_time = 0 FOR {ENDLESS_CTE}", 3), sql(ENDLESS_CTE, 4), wrong),
               after=lingering_queries),
    ]


ENDLESS_CTE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
LINGER_WAIT_S = 5.0  # how long a closed session's statements may take to end (the KILL on close is at once)


def lingering_queries(task: Any) -> str:
    """"" when no statement of a closed MariaDB session still runs on the task's server, else which do
    (on c07c523 the endless CTE ran on at 80% CPU after its session closed). Not MariaDB, or a private server
    per session (stopped with it): nothing to see."""
    import time

    address = getattr(task, "_address", None)  # the operator's server; a private one goes with its session
    if getattr(task, "backend", "") != "mariadb" or address is None:
        return ""
    deadline = time.monotonic() + LINGER_WAIT_S
    while True:
        conn = address.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT ID, USER, TIME, INFO FROM information_schema.PROCESSLIST "
                            "WHERE COMMAND = 'Query' AND ID <> CONNECTION_ID() AND USER LIKE 'agentrl%'")
                rows = cur.fetchall()
        finally:
            conn.close()
        if not rows or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return "; ".join(f"query {r[0]} of {r[1]} still running after {r[2]} s: {str(r[3])[:60]}" for r in rows)


# ------------------------------------------------------------------------------------------------ kg

def _kg_entity(initial: list[dict[str, Any]]) -> str:
    """The first entity the question names ("...\nEntities: [a, b]")."""
    return str(initial[-1]["content"]).rpartition("Entities: [")[2].rstrip("]").split(", ")[0]


def _kg_relations(initial: list[dict[str, Any]], last: list[dict[str, Any]]) -> dict[str, Any]:
    return call("get_relations", {"variable": _kg_entity(initial)})


def _kg_neighbors(initial: list[dict[str, Any]], last: list[dict[str, Any]]) -> dict[str, Any]:
    shown = str(last[0]["content"]).removeprefix("Observation: [").rstrip("]").split(", ") if last else [""]
    return call("get_neighbors", {"variable": _kg_entity(initial), "relation": shown[0]})


def kg_attacks() -> list[Attack]:
    chain = [calls([("intersection", {"variable1": f"#{k}", "variable2": f"#{k}"}) for k in range(i, i + 16)])
             for i in range(0, 48, 16)]
    return [
        Attack("kg_intersection_chain", "kg", "intersection(#k, #k) chains",
               (_kg_relations, _kg_neighbors, *chain, call("get_relations", {"variable": "#6"}),
                text("Final Answer: #6"))),
        Attack("kg_missing_variable", "kg", "a final answer naming no variable", (text("Final Answer: #999"),)),
    ]


TASK_ATTACKS: dict[str, Callable[[], list[Attack]]] = {"os": os_attacks, "db": db_attacks, "kg": kg_attacks}


def attacks_for(task: str, tools: list[dict[str, Any]]) -> list[Attack]:
    """The generic attacks on `task` (from its tool schemas), then those aimed at it, if any."""
    return (generic(task, tools) + wire_attacks(task, tools) + TASK_ATTACKS.get(task, list)()
            + resource_attacks(task))
