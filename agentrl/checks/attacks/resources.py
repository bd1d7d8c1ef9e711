"""Attacks on what a session may take from its neighbours: memory, disk, time, the interpreter
lock, kernel objects, cgroups, and moves per message.

Each class the issue names is here with at least one variant beyond the named instance: memory bombs
through values (zeroblob), columns (randomblob in many), strings (printf padding, a doubling recursive CTE,
JSON) and the client library (MariaDB's REPEAT); temporary storage (TEMP tables, a recursive CTE's own
table, an internal temporary table lifted by SET SESSION, a session's own tables past its quota); the
message budget (sixteen endless statements in one message); results the decoder rejects and statements that
cannot be encoded; Python work that never lets go of the lock (BFCL's power and Decimal square roots), a
number too long to print; kernel objects (inotify, fanotify, keys, pipe buffers, message queues, held by a
background process while a probe looks from outside); a session's teardown after hundreds of thousands of
directories; and a message holding a whole plan of moves. The verdicts beyond the shared ones (no reward,
no env_error, a healthy worker: `runner`) are the attacks' own: `max_acts` (tool results that acted in
one message), `probe` (a look from outside while the session lives) and `after` (what outlived it).
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.checks.attacks.attack import Attack, call, calls, host_file_table_problems, text
from agentrl.checks.attacks.channels import os_channel_attacks

log = logging.getLogger(__name__)

ROWS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT {n}) "
ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"


def _sql(query: str, i: int = 0) -> dict[str, Any]:
    return call("execute_sql", {"query": query}, f"c{i}")


def _sqls(queries: list[str]) -> dict[str, Any]:
    return calls([("execute_sql", {"query": q}) for q in queries])


WRONG_COMMIT = call("commit_final_answer", {"answers": ["no such value"]}, "c99")


def db_resource_attacks() -> list[Attack]:
    """SQLite and MariaDB alike (each statement is valid on at least one; the other answers an error)."""
    return [
        Attack("db_blob_rows", "db", "zeroblob/REPEAT values over thousands of rows",
               (_sqls([ROWS.format(n=10000) + "SELECT zeroblob(16000000) FROM c",
                       ROWS.format(n=200) + "SELECT zeroblob(1000000), x FROM c",
                       "SELECT REPEAT('x', 16000000) FROM seq_1_to_100"]), WRONG_COMMIT)),
        Attack("db_wide_rows", "db", "rows of many 1 MB columns, and a string doubled by a recursive CTE",
               (_sqls(["SELECT " + ", ".join(["randomblob(1000000)"] * 200),
                       "SELECT " + ", ".join(["REPEAT('y', 1000000)"] * 60) + " FROM seq_1_to_20",
                       "WITH RECURSIVE c(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM c) SELECT length(s) FROM c",
                       "SELECT length(printf('%.*c', 2147483647, 'x'))",
                       "SELECT json_group_array(randomblob(100000)) FROM (" + ROWS.format(n=10000) + "SELECT x FROM c)",
                       "SELECT GROUP_CONCAT(REPEAT('z', 1000000)) FROM seq_1_to_1000"]), WRONG_COMMIT)),
        Attack("db_temp_storage", "db", "TEMP tables, a recursive CTE's own table and lifted temporary-table "
               "limits filling the host's disk",
               (_sqls(["CREATE TEMP TABLE t AS " + ROWS.format(n=100000) + "SELECT x, randomblob(20000) FROM c",
                       "CREATE TEMPORARY TABLE t (a LONGTEXT)",
                       "SET SESSION tmp_disk_table_size = 100000000000",
                       "SET SESSION max_heap_table_size = 100000000000",
                       "SET SESSION max_recursive_iterations = 4294967295",
                       "WITH RECURSIVE c(x, s) AS (SELECT 1, REPEAT('x', 100000) UNION ALL SELECT x + 1, s FROM c) "
                       "SELECT COUNT(*) FROM c",
                       "SELECT REPEAT(a.seq, 1000) AS x FROM seq_1_to_100000000 a ORDER BY x"]), WRONG_COMMIT)),
        Attack("db_disk_quota", "db", "a session's own tables grown past its quota, statement after statement",
               (_sqls(["CREATE TABLE big (a LONGTEXT)"] +
                      ["INSERT INTO big SELECT REPEAT('x', 1000000) FROM seq_1_to_100"] * 15),
                _sqls(["CREATE TABLE big2 AS " + ROWS.format(n=1000) + "SELECT x, randomblob(1000000) AS b FROM c"]),
                WRONG_COMMIT)),
        Attack("db_endless_message", "db", "sixteen endless recursive CTEs in one message: past the message's "
               "budget, never the worker's deadline",
               (_sqls([ENDLESS] * 16), WRONG_COMMIT)),
        Attack("db_bad_text", "db", "results the decoder rejects and statements that cannot be encoded",
               (_sqls(["SET character_set_results = latin1", "SELECT 'é', CAST(x'ff' AS TEXT)",
                       "SELECT CAST(x'ff' AS TEXT)", "SET NAMES binary", "SELECT 'é'", "SELECT '\ud800'"]),
                _sql("SELECT 1"), WRONG_COMMIT)),
    ]


def kg_resource_attacks() -> list[Attack]:
    huge = "#" + "9" * 4301
    return [
        Attack("kg_huge_numbers", "kg", "variables and a final answer of 4,301 digits",
               (call("get_relations", {"variable": huge}), call("count", {"variable": huge}),
                text(f"Final Answer: {huge}"))),
    ]


def bfcl_resource_attacks() -> list[Attack]:
    """Index test-15 involves MathAPI."""
    return [
        Attack("bfcl_power_lock", "bfcl", "power(10, 14758103): seconds holding the interpreter lock",
               (call("power", {"base": 10, "exponent": 14758103}),), "test-15"),
        Attack("bfcl_decimal_lock", "bfcl", "a square root to 100,000,000 digits: the lock and the memory",
               (call("square_root", {"number": 2, "precision": 100000000}),), "test-15"),
        Attack("bfcl_unprintable", "bfcl", "power(10, 5000) and friends: results too long to print",
               (calls([("power", {"base": 10, "exponent": 5000}), ("multiply", {"a": 10**2000, "b": 10**2400}),
                       ("add", {"a": 1e308, "b": 1e308}), ("mean", {"numbers": [1e308] * 100})]), text("Done.")),
               "test-15"),
    ]


# ------------------------------------------------------------------------------------ moves per message

def _available(last: list[dict[str, Any]], key: str) -> list[str]:
    """The actions the last observation offers (alfworld's "AVAILABLE ACTIONS:", webshop's clickables)."""
    body = "\n".join(str(m.get("content", "")) for m in last)
    if key == "alfworld":
        return [a.strip() for a in body.rpartition("AVAILABLE ACTIONS:")[2].splitlines() if a.strip()]
    found = re.search(r"'clickables': \[(.*?)\]", body)
    return re.findall(r"'([^']*)'", found.group(1)) if found else []


def _all_moves(tool: str, argument: str, key: str) -> Callable[[list[dict[str, Any]], list[dict[str, Any]]],
                                                              dict[str, Any]]:
    def message(initial: list[dict[str, Any]], last: list[dict[str, Any]]) -> dict[str, Any]:
        moves = _available(last or initial, key)[:16] or ["look"]
        return calls([(tool, {argument: m}) for m in moves])
    return message


def move_attacks() -> list[Attack]:
    return [
        Attack("alfworld_many_moves", "alfworld", "every available action in one message, round after round "
               "(a blind policy won 0.30 of the games this way)",
               tuple(_all_moves("take_action", "action", "alfworld") for _ in range(6)), max_acts=1),
        Attack("webshop_many_clicks", "webshop", "a search, then every clickable in one message",
               (calls([("search_action", {"keywords": k}) for k in ("shirt", "shoes", "tea")]),
                *(_all_moves("click_action", "value", "webshop") for _ in range(4))), max_acts=1),
        Attack("os_many_commands", "os", "sixteen commands in one message, then sixteen answers",
               (calls([("bash_action", {"script": f"echo {i}"}) for i in range(16)]),
                calls([("answer_action", {"answer": str(i)}) for i in range(16)])), "train-0", max_acts=1),
    ]


# ------------------------------------------------------------------------------------ kernel objects, cgroups

HOLDER = r"""cat > /tmp/h.py <<'EOF'
import ctypes, fcntl, os, time
libc = ctypes.CDLL(None, use_errno=True)
held = [libc.inotify_init1(0) for _ in range(200)] + [libc.fanotify_init(0, 0) for _ in range(200)]
for i in range(50):
    libc.syscall(248, b"user", b"agentrl-attack-%d" % i, b"secret", 6, ctypes.c_int(-4))  # add_key, x86_64
pipes = [os.pipe() for _ in range(1100)]
for r, w in pipes[:64]:
    try:
        fcntl.fcntl(w, 1031, 1 << 20)
    except OSError:
        pass
try:
    import posix_ipc  # noqa: F401 - not in the image; mq_open through ctypes instead
except ImportError:
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    for i in range(20):
        rt.mq_open(b"/agentrl%d" % i, 0o100 | 0o2, 0o600, None)
print("holding", flush=True)
time.sleep(120)
EOF
(python3 /tmp/h.py > /tmp/h.out 2>&1 &); sleep 2; cat /tmp/h.out"""
PIPE_PROBE = "python3 -c \"import os, fcntl; r, w = os.pipe(); print(fcntl.fcntl(w, 1032))\"; cat /proc/keys; echo end"


def _kernel_probe(task: Any) -> str:
    """While the attacker's session holds what it could get: the worker's own process can still make an
    inotify instance, and a new session (its own uid range, as the task's budget gives it) sees full-size
    pipes and none of the attacker's keys. "" when all holds, else what did not."""
    from agentrl.sandbox import Shell

    problems = []
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    if fd < 0:
        problems.append(f"the worker cannot make an inotify instance ({os.strerror(ctypes.get_errno())})")
    else:
        os.close(fd)
    budget = getattr(task, "budget", None)
    slot = budget.acquire() if budget is not None else 1
    try:
        shell = Shell(task.sandbox, uid_slot=slot)
        try:
            out = shell.run(PIPE_PROBE).output
        finally:
            shell.close()
    finally:
        if budget is not None:
            budget.release(slot)
    first = out.split()[0] if out.split() else ""
    if first != "65536":
        problems.append(f"a new session's pipes hold {first or '?'} bytes, not 65536")
    if "agentrl-attack" in out:
        problems.append("a new session sees the attacker's kernel keys")
    return "; ".join(problems)


DIRECTORIES = ("python3 -c \"import os\nfor i in range(600000): os.mkdir('/tmp/d%d' % i)\nprint('made')\"; "
               "(sleep 300 &); echo done")


def _session_cgroups() -> set[Path]:
    """Every session cgroup directory on this host's cgroup parents (none where cgroups are not made)."""
    from agentrl.sandbox import cgroup_support

    support = cgroup_support()
    if support.kind is None:
        return set()
    return {d for parent in support.parents.values() for d in Path(parent).glob("agentrl-session-*")}


def _cgroups_left(task: Any, before: frozenset[Path] = frozenset()) -> str:
    """"" when no session cgroup outlived its session (none empty is left, none waits for the reaper). Those in
    `before` were there before the attacks: another worker's on this host, or one whose worker was killed."""
    from agentrl.sandbox import cgroups

    left = []
    for d in sorted(_session_cgroups() - before):
        try:
            if not (d / "cgroup.procs").read_text().split():
                left.append(d.name)
        except OSError:
            continue
    pending = cgroups.pending()
    return (f"{len(left)} session cgroup(s) left behind ({', '.join(left[:3])}); {pending} waiting for the reaper"
            if left or pending else "")


def os_resource_attacks() -> list[Attack]:
    wrong = call("answer_action", {"answer": "this is not a number"}, "c9")
    before = frozenset(_session_cgroups())  # not the attacks': only what they leave is theirs
    return [
        Attack("os_kernel_objects", "os", "inotify, fanotify, keys, pipes and message queues held by a background "
               "process while a new session and the worker look",
               (call("bash_action", {"script": HOLDER}),), "train-0", probe=_kernel_probe),
        Attack("os_directories_teardown", "os", "600,000 directories and a sleeper left at the end: the session's "
               "cgroup must go with it",
               (call("bash_action", {"script": DIRECTORIES}), wrong), "train-0",
               after=lambda task: _cgroups_left(task, before)),
    ]




# ------------------------------------------------------------------------------- host tables and channels

TABLE_HOG = r"""cat > /tmp/t.py <<'EOF'
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
ctx = ctypes.c_ulong(0)
aio = libc.syscall(206, 65536, ctypes.byref(ctx))
ptys = []
try:
    while True:
        ptys.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
except OSError:
    pass
for _ in range(30):
    if os.fork() == 0:
        held = []
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            time.sleep(120)
        os._exit(0)
print("aio", aio, "ptys", len(ptys), flush=True)
time.sleep(120)
EOF
(python3 /tmp/t.py > /tmp/t.out 2>&1 &); sleep 3; cat /tmp/t.out
cat /proc/sys/fs/aio-nr /proc/sys/kernel/pty/nr /proc/sys/fs/file-nr 2>&1"""
TABLE_PROBE = ("python3 -c \"import os; print('ptys', len([os.open('/dev/ptmx', os.O_RDWR | os.O_NOCTTY) "
               "for _ in range(4)]))\"; cat /proc/sys/fs/aio-nr /proc/sys/kernel/pty/nr /proc/sys/fs/file-nr "
               "/proc/locks 2>/dev/null | wc -c")


def _table_probe(task: Any) -> str:
    """While the attacker holds every AIO context, pty and file it could get: the host's file table is far from
    full, the worker (host root) and a new session can still open ptys, and the session reads none of the
    host's counts of them. "" when all holds, else what did not."""
    from agentrl.sandbox import Shell

    problems = host_file_table_problems()
    try:
        os.close(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    except OSError as e:
        problems.append(f"the worker cannot open a pty ({e})")
    budget = getattr(task, "budget", None)
    slot = budget.acquire() if budget is not None else 1
    try:
        shell = Shell(task.sandbox, uid_slot=slot)
        try:
            out = shell.run(TABLE_PROBE).output.split()
        finally:
            shell.close()
    finally:
        if budget is not None:
            budget.release(slot)
    if out[:2] != ["ptys", "4"]:
        problems.append(f"a new session could not open 4 ptys ({' '.join(out)[:120]})")
    if out[-1:] != ["0"]:
        problems.append(f"a new session reads the host's counts ({out[-1:]} bytes)")
    return "; ".join(problems)


def os_table_attacks() -> list[Attack]:
    return [Attack("os_host_tables", "os", "every AIO context, pty and open file a session can get, held by 31 "
                   "processes while the worker and a new session look",
                   (call("bash_action", {"script": TABLE_HOG}),), "train-0", probe=_table_probe)]


LOCK = "agentrl_attack"


def _channel_probe(task: Any) -> str:
    """While the attacker's session holds a user lock and has run 47 SELECTs: a database opened now (another
    session's) sees the lock free and its server's Com_select at its own few. "" on SQLite (nothing shared)."""
    if getattr(task, "backend", "") != "mariadb":
        return ""
    db = task.open_database([])
    try:
        free = db.execute(f"SELECT IS_FREE_LOCK('{LOCK}')")
        selects = db.execute("SHOW GLOBAL STATUS LIKE 'Com_select'")
    finally:
        db.close()
    problems = [] if free == "[(1,)]" else [f"another session's IS_FREE_LOCK says {free}"]
    count = re.findall(r"'(\d+)'", selects)
    if not count or int(count[-1]) >= 30:
        problems.append(f"another session's server counts the attacker's SELECTs ({selects[:80]})")
    return "; ".join(problems)


def db_channel_attacks() -> list[Attack]:
    return [Attack("db_server_channel", "db", "a user lock held and 47 SELECTs run while another session "
                   "reads IS_FREE_LOCK and SHOW GLOBAL STATUS (MariaDB)",
                   (_sqls([f"SELECT GET_LOCK('{LOCK}', 0)", "SELECT UUID_SHORT()"] + ["SELECT 1"] * 14),
                    _sqls(["SELECT 1"] * 16), _sqls(["SELECT 1"] * 16)),  # 16 calls a message at most
                   probe=_channel_probe)]


RESOURCE_ATTACKS: dict[str, Callable[[], list[Attack]]] = {
    "db": lambda: db_resource_attacks() + db_channel_attacks(), "kg": kg_resource_attacks,
    "bfcl": bfcl_resource_attacks, "os": lambda: os_resource_attacks() + os_table_attacks() + os_channel_attacks()}


def resource_attacks(task: str) -> list[Attack]:
    """This module's attacks aimed at `task` (none for a task of another name)."""
    return RESOURCE_ATTACKS.get(task, list)() + [a for a in move_attacks() if a.task == task]
