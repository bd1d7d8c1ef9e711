"""The `os` task's own samples, in AgentBench's os_interaction format, from a fixed seed.

`generate(split, n)` draws sample i of a split from `random.Random(f"os:{split}:{i}")`, so the files in
`data/os/` are reproducible (`python -m jobs.make_task_data os`) and test samples are fresh draws, not
train samples. Fourteen templates cover AgentBench's kinds of problem: counting and finding files,
reading logs and CSVs, permissions, users, background processes, and operations whose result a check
script verifies. Every sample carries an `example` (the reference solution the scripted expert runs),
and uses AgentBench's three evaluation forms: `match`, `check` with a `null` step (the answer is
compared with the example's output in the same sandbox), and `check` of the machine's state.

The samples only touch paths that are per-session in the sandbox (/root, /home, /tmp, /usr/local/bin,
/etc files) and need only bash, coreutils, findutils, grep, gawk/mawk, python3 and passwd.
"""
from __future__ import annotations

import random
import shlex
from collections import Counter
from collections.abc import Callable
from typing import Any

SPLIT_SIZES = {"train": 300, "test": 60}

# Our own check script (argv[1] = the answer, argv[2] = the example's output).
INT_MATCH = ("import sys\n"
             "try:\n    ok = int(sys.argv[1].strip()) == int(sys.argv[2].strip())\n"
             "except ValueError:\n    ok = False\n"
             "sys.exit(0 if ok else 1)\n")

WORDS = ("alpha", "bravo", "cedar", "delta", "ember", "fable", "gamma", "harbor", "indigo", "juniper", "kettle",
         "lumen", "maple", "nectar", "orbit", "pepper", "quartz", "raven", "saffron", "tundra", "umber", "velvet",
         "willow", "xenon", "yarrow", "zephyr")
EXTS = ("txt", "log", "csv", "md", "json", "conf")
USERS = ("alice", "bruno", "chen", "dara", "emeka", "farah", "goran", "hana", "ivan", "jonas", "kiri", "leona")

Item = dict[str, Any]


def _check_answer(example: str, checker: str = INT_MATCH) -> dict[str, Any]:
    return {"check": [None, {"language": "python", "code": checker}], "example": {"code": example}}


def _item(description: str, init: str | None, evaluation: dict[str, Any], labels: list[str],
          example: str | None = None, start: str | None = None) -> Item:
    item: Item = {"description": description}
    if init:
        item["create"] = {"local": "default", "init": {"code": init}}
    if start:
        item["start"] = start
    item["evaluation"] = evaluation
    if example is not None:
        item["example"] = {"code": example}
    item["labels"] = labels
    return item


def _name(rng: random.Random) -> str:
    return f"{rng.choice(WORDS)}{rng.randint(1, 99)}"


def count_extension(rng: random.Random) -> Item:
    base = f"/root/{rng.choice(WORDS)}"
    ext = rng.choice(EXTS)
    subdirs = rng.choices(["", "a/", "a/b/", "c/"], k=rng.randint(6, 14))
    files = {f"{base}/{sub}{_name(rng)}.{rng.choice(EXTS)}" for sub in subdirs}
    files.add(f"{base}/{_name(rng)}.{ext}")
    dirs = sorted({f.rsplit("/", 1)[0] for f in files})
    init = f"mkdir -p {' '.join(dirs)} && touch {' '.join(sorted(files))}"
    return _item(f"How many files with the extension .{ext} are there in {base} and its subdirectories?", init,
                 _check_answer(f"find {base} -type f -name '*.{ext}' | wc -l"), ["file"])


def line_count(rng: random.Random) -> Item:
    path = f"/home/{rng.choice(USERS)}/{rng.choice(WORDS)}.txt"
    n = rng.randint(3, 60)
    lines = "\\n".join(f"{rng.choice(WORDS)} {rng.randint(0, 999)}" for _ in range(n))
    init = f"mkdir -p {path.rsplit('/', 1)[0]} && printf '{lines}\\n' > {path}"
    return _item(f"How many lines does the file {path} have? Answer with the number only.", init,
                 {"match": str(n)}, ["file"], example=f"wc -l < {path}")


def grep_count(rng: random.Random) -> Item:
    path = f"/root/logs/{rng.choice(WORDS)}.log"
    levels = [rng.choice(["INFO", "INFO", "WARN", "ERROR", "DEBUG"]) for _ in range(rng.randint(10, 50))]
    level = rng.choice(sorted(set(levels)))
    body = "\\n".join(f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)} {lv} {rng.choice(WORDS)} "
                      f"code={rng.randint(1, 500)}" for lv in levels)
    init = f"mkdir -p /root/logs && printf '{body}\\n' > {path}"
    return _item(f"How many lines of the log file {path} have the level {level}?", init,
                 {"match": str(levels.count(level))}, ["log", "file"], example=f"grep -c ' {level} ' {path}")


def column_sum(rng: random.Random) -> Item:
    path = f"/root/{rng.choice(WORDS)}.csv"
    cols = rng.sample(["price", "count", "weight", "score", "age"], 3)
    rows = [[rng.randint(1, 200) for _ in cols] for _ in range(rng.randint(4, 20))]
    col = rng.randrange(3)
    body = "\\n".join([",".join(cols)] + [",".join(map(str, r)) for r in rows])
    init = f"printf '{body}\\n' > {path}"
    example = f"awk -F, 'NR > 1 {{s += ${col + 1}}} END {{print s}}' {path}"
    return _item(f"{path} is a CSV file with a header line. What is the sum of its \"{cols[col]}\" column?", init,
                 {"match": str(sum(r[col] for r in rows))}, ["file", "command"], example=example)


def largest_file(rng: random.Random) -> Item:
    base = f"/root/{rng.choice(WORDS)}"
    names = sorted({_name(rng) + ".bin" for _ in range(rng.randint(3, 7))})
    sizes = rng.sample(range(100, 5000), len(names))
    init = " && ".join([f"mkdir -p {base}"] + [f"head -c {s} /dev/zero > {base}/{n}" for n, s in zip(names, sizes)])
    answer = names[sizes.index(max(sizes))]
    return _item(f"Which file in {base} is the largest? Answer with its name only, without the directory.", init,
                 {"match": answer}, ["file"], example=f"ls -S {base} | head -n 1")


def find_word(rng: random.Random) -> Item:
    base = f"/home/{rng.choice(USERS)}/notes"
    names = sorted({_name(rng) + ".txt" for _ in range(rng.randint(3, 6))})
    secret = f"{rng.choice(WORDS).upper()}{rng.randint(100, 999)}"
    target = rng.choice(names)
    parts = [f"mkdir -p {base}"]
    for n in names:
        words = " ".join(rng.choice(WORDS) for _ in range(8))
        if n == target:
            words += f" {secret}"
        parts.append(f"echo '{words}' > {base}/{n}")
    return _item(f"Which file in {base} contains the word {secret}? Answer with the file name only.",
                 " && ".join(parts), {"match": target}, ["file", "command"],
                 example=f"basename \"$(grep -l {secret} {base}/*)\"")


def permissions(rng: random.Random) -> Item:
    path = f"/root/{_name(rng)}.sh"
    mode = rng.choice(["600", "640", "644", "700", "750", "755", "400", "444"])
    return _item(f"What are the permissions of {path} in octal notation (for example 644)?",
                 f"echo 'echo hi' > {path} && chmod {mode} {path}", {"match": mode}, ["permission", "file"],
                 example=f"stat -c %a {path}")


def word_frequency(rng: random.Random) -> Item:
    path = f"/tmp/{rng.choice(WORDS)}-words.txt"
    pool = rng.sample(WORDS, 5)
    counts = Counter({w: rng.randint(1, 9) for w in pool})
    top = max(counts.values())
    winner = next(w for w in pool if counts[w] == top)
    for w in pool:  # a single most frequent word
        if w != winner and counts[w] == top:
            counts[w] -= 1
    words = [w for w, c in counts.items() for _ in range(c)]
    rng.shuffle(words)
    init = f"echo '{' '.join(words)}' > {path}"
    example = f"tr -s ' ' '\\n' < {path} | sort | uniq -c | sort -rn | head -n 1 | awk '{{print $2}}'"
    return _item(f"Which word occurs most often in {path}? Answer with the word only.", init,
                 {"match": winner}, ["file", "command"], example=example)


def count_users_shell(rng: random.Random) -> Item:
    users = rng.sample(USERS, rng.randint(1, 4))
    init = " && ".join(f"useradd -s /bin/bash {u}" for u in users)
    return _item("How many users on this system have /bin/bash as their login shell?", init,
                 _check_answer("grep -c ':/bin/bash$' /etc/passwd"), ["user"])


def background_writer(rng: random.Random) -> Item:
    target = f"{rng.choice(WORDS)}.out"
    decoys = sorted({f"{rng.choice(WORDS)}.out" for _ in range(3)} - {target})
    init = f"mkdir -p /root/spool && touch {' '.join('/root/spool/' + d for d in decoys)}"
    start = f"(while true; do date >> /root/spool/{target}; sleep 1; done) >/dev/null 2>&1 &"
    return _item("A background program appends a line to a file in /root/spool every second. Which file? "
                 "Answer with the file name only.", init, {"match": target}, ["process", "background", "file"],
                 example="sleep 1.5; ls -t /root/spool | head -n 1", start=start)


def create_file(rng: random.Random) -> Item:
    path = f"/root/{_name(rng)}.txt"
    text = " ".join(rng.choice(WORDS) for _ in range(3))
    check = f'[ "$(cat {path})" = {shlex.quote(text)} ]'
    return _item(f"Create the file {path} containing exactly the line: {text}", None,
                 {"check": {"code": check}, "example": {"code": f"echo {shlex.quote(text)} > {path}"}}, ["file"])


def make_executable(rng: random.Random) -> Item:
    path = f"/root/bin/{rng.choice(WORDS)}.sh"
    init = f"mkdir -p /root/bin && printf '#!/bin/sh\\necho ok\\n' > {path} && chmod 644 {path}"
    return _item(f"Make the script {path} executable, so that running {path} works.", init,
                 {"check": {"code": f"[ \"$({path})\" = ok ]"}, "example": {"code": f"chmod +x {path}"}},
                 ["permission", "file"])


def create_user(rng: random.Random) -> Item:
    user = f"{rng.choice(USERS)}{rng.randint(1, 9)}"
    group = rng.choice(["staff", "users", "adm"])
    check = f"id -u {user} >/dev/null && id -nG {user} | tr ' ' '\\n' | grep -qx {group}"
    return _item(f"Create a user named {user} who is also a member of the group {group}.", None,
                 {"check": {"code": check}, "example": {"code": f"useradd -G {group} {user}"}}, ["user"])


def install_command(rng: random.Random) -> Item:
    name = rng.choice(WORDS) + "ctl"
    word = rng.choice(WORDS).upper()
    check = f"[ \"$({name})\" = {word} ]"
    example = f"printf '#!/bin/sh\\necho {word}\\n' > /usr/local/bin/{name} && chmod +x /usr/local/bin/{name}"
    return _item(f"Make a command named {name}, available to every user on the PATH, that prints {word}.", None,
                 {"check": {"code": check}, "example": {"code": example}}, ["command"])


TEMPLATES: tuple[Callable[[random.Random], Item], ...] = (
    count_extension, line_count, grep_count, column_sum, largest_file, find_word, permissions, word_frequency,
    count_users_shell, background_writer, create_file, make_executable, create_user, install_command)


def generate(split: str, n: int | None = None) -> list[Item]:
    """Samples 0..n-1 of `split` (default: its size in SPLIT_SIZES); template i % 14 for balance."""
    count = SPLIT_SIZES[split] if n is None else n
    items = []
    for i in range(count):
        rng = random.Random(f"os:{split}:{i}")
        items.append(TEMPLATES[i % len(TEMPLATES)](rng))
    return items
