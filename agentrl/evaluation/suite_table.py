"""The suite's table: each family's results from its files, the AgentBench average, suite.json and suite.md beside
the paper's rows, and the terminal's lines.

Success per family is over the episodes scored, with the Wilson 95% interval (`eval_stats.wilson_interval`, as
the run report draws it) and the binomial standard error; env errors count as failures and are reported. The
episodes a budget or a signal left are counted as unfinished (never as failures, never dropped), with the range
they leave, and the table says it is partial.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.evaluation.suite_plan import FamilyPlan, Mode, SuiteSpec, sessions_path, stem_of
from agentrl.evaluation.targets import Target
from agentrl.monitor.eval_results import aggregate_task, read_results
from agentrl.monitor.eval_stats import STATUSES, wilson_interval
from agentrl.monitor.eval_tables import AGENTBENCH_COLUMNS, PUBLISHED


def _rate(successes: int, n: int) -> dict[str, Any]:
    if n == 0:
        return {"success": None, "stderr": None, "wilson": None}
    p = successes / n
    iv = wilson_interval(successes, n)
    return {"success": p, "stderr": math.sqrt(p * (1 - p) / n), "wilson": [iv.lo, iv.hi]}


def mode_result(target: Target, plan_: FamilyPlan, mode: Mode, out: Path) -> dict[str, Any]:
    """One family and mode from its files: success over the episodes scored (Wilson 95%, binomial s.e.), the
    unfinished ones counted beside them with the range they leave, statuses, tokens and measured wall time
    (`shared`: some of it was spent beside other families on the same engine, so its tokens/s is its share)."""
    path = out / plan_.family.name / f"{stem_of(target, plan_.family, mode)}.jsonl"
    keys = plan_.keys.get(mode.name, [])
    in_scope = set(keys)
    eps = [e for e in read_results(path) if e.key in in_scope]
    n, planned = len(eps), len(keys)
    ok = sum(e.success > 0.5 for e in eps)
    unfinished = planned - n
    status = dict.fromkeys(STATUSES, 0)
    status.update(Counter(e.status for e in eps))
    status = {k: v for k, v in status.items() if v}
    if unfinished:
        status["unfinished"] = unfinished
    sessions = json.loads(sessions_path(path).read_text())["sessions"] if sessions_path(path).exists() else []
    tokens = sum(e.tokens for e in eps)
    wall = sum(s["wall_s"] for s in sessions)
    r: dict[str, Any] = {
        "results": str(path), "planned": planned, "episodes": n, "unfinished": unfinished, "successes": ok,
        **_rate(ok, n),
        "bounds": [ok / planned, (ok + unfinished) / planned] if planned else None,
        "status": status, "runs": mode.runs, "temperature": mode.temperature,
        "turns": sum(e.turns for e in eps) / n if n else None, "tokens": tokens,
        "wall_s": round(wall, 1), "tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
        "sessions": len(sessions), "shared": any(s.get("alongside") for s in sessions),
        "worst_case": plan_.worst_case(mode.name),
    }
    if n and mode.runs > 1:
        runs = aggregate_task(eps, ks=range(1, mode.runs + 1)).success
        r["t_interval_over_runs"] = runs.to_dict()
    return r


def summarize(target: Target, spec: SuiteSpec, plans: Sequence[FamilyPlan], out: Path, *, label: str,
              scale: str, command: str, wall_s: float, engine_s: float, stopped: str = "",
              interrupted: bool = False, protocol: str = "faithful") -> dict[str, Any]:
    """The suite's JSON from the families' files (what `write` turns into suite.json and suite.md)."""
    families: dict[str, Any] = {}
    partial = bool(stopped) or interrupted
    for p in plans:
        f = p.family
        d: dict[str, Any] = {"task": f.name, "split": f.split, "data": f.data, "options": dict(f.options),
                             "concurrency": f.at_once(spec.concurrency),
                             "max_turns": p.max_turns, "max_model_len": p.limits.max_model_len,
                             "max_new_tokens": p.limits.max_new_tokens}
        if p.error:
            d["error"] = p.error
            partial = True
        else:
            for mode in spec.modes:
                d[mode.name] = mode_result(target, p, mode, out)
                partial |= d[mode.name]["unfinished"] > 0
        families[f.name] = d
    reason = [f"{p.family.name} not played" for p in plans if p.error]
    if stopped:
        reason.append(f"the {spec.budget_s / 60:g}-minute budget ran out at {stopped}")
    if interrupted:
        reason.append("stopped by a signal")
    if spec.samples:
        reason.append(f"the first {spec.samples} indices of each split only")
    return {"label": label, "target": target.describe(), "scale": scale, "command": command, "protocol": protocol,
            "partial": partial or spec.samples > 0, "partial_reason": "; ".join(reason),
            "samples": spec.samples, "budget_min": spec.budget_s / 60 if spec.budget_s else None,
            "modes": [m.__dict__ for m in spec.modes], "concurrency": spec.concurrency,
            "sequential": spec.sequential, "wall_s": round(wall_s, 1),
            "engine_start_s": round(engine_s, 1), "families": families,
            "average": {m.name: _average(families, m.name) for m in spec.modes}}


def _average(families: Mapping[str, Any], mode: str) -> dict[str, Any] | None:
    """AgentBench's Avg: the mean over its families present (each weighs the same), BFCL apart."""
    rates = [families[t][mode]["success"] for t, _ in AGENTBENCH_COLUMNS
             if t in families and mode in families[t] and families[t][mode]["success"] is not None]
    if not rates:
        return None
    return {"success": sum(rates) / len(rates), "families": len(rates)}


def _cell(r: Mapping[str, Any] | None) -> str:
    if not r or r.get("success") is None:
        return "-" if not r or not r.get("unfinished") else "unfinished"
    lo, hi = r["wilson"]
    text = f"{100 * r['success']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"
    if r["unfinished"]:
        text += f" ({r['episodes']} of {r['planned']})"
    return text


def markdown(s: Mapping[str, Any]) -> str:
    """suite.md: the model's rows beside the paper's, then per family its split, episodes, statuses, wall time
    and worst case, the settings and the command."""
    fam = s["families"]
    modes = [m["name"] for m in s["modes"]]
    head = ["model", *[t for _, t in AGENTBENCH_COLUMNS], "Avg", "BFCL"]
    lines = [f"# {s['label']}: AgentBench-FC's five families and BFCL", "", s["scale"], ""]
    if s["partial"]:
        cut = any(d.get(m, {}).get("unfinished") for d in fam.values() for m in modes)
        lines += [f"**Partial**: {s['partial_reason'] or 'some episodes are unfinished'}. Success is over the "
                  "episodes scored; the unfinished ones are counted in `ended`, never as failures"
                  + (" (where a family was cut short, the episodes it finished lean toward its shorter ones, "
                     "and its rate with them)" if cut else "") + ".", ""]
    ours = "; ".join(f"{n}: {d['data']}" for n, d in fam.items())
    lines += [f"Success % [Wilson 95%]. Ours ({s.get('protocol', 'faithful')} protocol for AgentBench's families): "
              f"{ours}. The paper's rows are AgentBench-FC's test set (`eval_tables.PUBLISHED`, which holds no BFCL "
              "numbers). Avg is the mean over the AgentBench families present.", "",
              "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode in modes:
        avg = s["average"].get(mode)
        cells = [_cell(fam.get(t, {}).get(mode)) if t in fam else "not run" for t, _ in AGENTBENCH_COLUMNS]
        avg_cell = "-" if not avg else f"{100 * avg['success']:.1f}" + (
            f" ({avg['families']} of {len(AGENTBENCH_COLUMNS)})" if avg["families"] < len(AGENTBENCH_COLUMNS) else "")
        bfcl = _cell(fam["bfcl"].get(mode)) if "bfcl" in fam else "not run"
        lines.append("| " + " | ".join([f"**{s['label']}** {mode} (ours)", *cells, avg_cell, bfcl]) + " |")
    for name, row in PUBLISHED.items():
        lines.append("| " + " | ".join([f"{name} (paper)", *[f"{x:.1f}" for x in row], "-"]) + " |")
    lines += ["", "| family | split | mode | episodes | success % [Wilson 95%] | s.e. | if the unfinished ended "
              "either way | ended | turns | generated tokens (worst case) | wall |", "|" + "---|" * 11]
    for name, d in fam.items():
        if "error" in d:
            lines.append(f"| {name} | {d['split']} | - | - | not played: {d['error']} | | | | | | |")
            continue
        for mode in modes:
            r = d[mode]
            se = f"{100 * r['stderr']:.1f}" if r["stderr"] is not None else "-"
            bounds = f"{100 * r['bounds'][0]:.1f}-{100 * r['bounds'][1]:.1f}" if r["unfinished"] else "-"
            ended = ", ".join(f"{k} {v}" for k, v in r["status"].items()) or "-"
            worst = r["worst_case"]["tokens"]
            tokens = f"{r['tokens']:,} ({worst:,})" if worst is not None else f"{r['tokens']:,} (?)"
            turns = f"{r['turns']:.1f}" if r["turns"] is not None else "-"
            lines.append(f"| {name} | {d['split']} | {mode} | {r['episodes']} of {r['planned']} | {_cell(r)} | {se} | "
                         f"{bounds} | {ended} | {turns} | {tokens} | {_minutes(r['wall_s'])}"
                         f"{' (shared)' if r.get('shared') else ''} |")
    shared = any(d.get(m, {}).get("shared") for d in fam.values() for m in modes)
    lines += ["", f"Wall time: {_minutes(s['wall_s'])} for this command (engine start {s['engine_start_s']:.0f} s); "
                  "a family's is summed over the commands that played it"
                  + (f"; (shared): played at the same time as other families on one engine, at most "
                     f"{s.get('concurrency')} episodes in flight across them, so these overlap and add up to more "
                     "than the command's" if shared else "") + ". `ended` counts episodes (completed; "
                  "turn_limit: the task's own round limit; context_limit: the token limit; env_error: counted as a "
                  "failure; unfinished: not played, the budget ran out or the command was stopped).", "",
              "| family | data | turn limit | context | max_new_tokens | at once | task options |",
              "|---|---|---|---|---|---|---|"]
    protocol = s.get("protocol", "faithful")
    for name, d in fam.items():
        opts = ", ".join(f"{k}={v}" for k, v in d["options"].items()) or "-"
        data = d["data"] + (f", {protocol}" if name != "bfcl" else "")
        lines.append(f"| {name} | {data} | {d['max_turns'] if d['max_turns'] is not None else '?'} | "
                     f"{d['max_model_len']} | {d['max_new_tokens']} | {d['concurrency']} | {opts} |")
    if "sampled" in modes:
        lines += ["", "The sampled rows' Wilson interval treats each episode as independent; the runs of one index "
                      "are not, so suite.json also gives each family's t-interval over its runs "
                      "(`t_interval_over_runs`)."]
    lines += ["", "BFCL's first prompts are 3.5-3.8k tokens, so it is given a context of its own (`--bfcl-context`), "
                  "never less than the others'.", "", "```", s["command"], "```", ""]
    return "\n".join(lines)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def write(summary: Mapping[str, Any], out: Path) -> tuple[Path, Path]:
    """OUT/suite.json and OUT/suite.md, each replaced whole."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in (("suite.json", json.dumps(summary, indent=2)), ("suite.md", markdown(summary))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)
        paths.append(out / name)
    return paths[0], paths[1]


def result_lines(summary: Mapping[str, Any]) -> list[str]:
    """Per family and mode: success, episodes, statuses, wall time against the worst case (the terminal's)."""
    lines = []
    for name, d in summary["families"].items():
        if "error" in d:
            lines.append(f"  {name}: not played: {d['error']}")
            continue
        for m in summary["modes"]:
            r = d[m["name"]]
            worst = r["worst_case"]["tokens"]
            lines.append(f"  {name} {d['split']} {m['name']}: {_cell(r)} over {r['episodes']} of {r['planned']} "
                         f"episodes; ended {', '.join(f'{k} {v}' for k, v in r['status'].items()) or '-'}; "
                         f"{r['tokens']:,} tokens generated (at most {f'{worst:,}' if worst is not None else '?'}) in "
                         f"{_minutes(r['wall_s'])}")
    if summary["partial"]:
        lines.append(f"  partial: {summary['partial_reason'] or 'unfinished episodes'}")
    return lines
