"""The `kg` task's default backend: a knowledge graph held in memory (`data/kg/graph.json`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.tasks.kg.program import Program
from agentrl.tasks.shared import read_json


class LocalGraph:
    """An in-memory graph: entities with names and types, triples, numeric attributes, a schema.

    File format (`graph.json`): {"entities": {id: {"name", "type"}}, "relations": {name: {"domain",
    "range"}}, "triples": [[s, r, o], ...], "attributes": {id: {attribute: number}}}.
    """

    def __init__(self, graph: dict[str, Any]) -> None:
        self.entities: dict[str, dict[str, str]] = graph["entities"]
        self.schema: dict[str, dict[str, str]] = graph["relations"]
        self.values: dict[str, dict[str, float]] = graph.get("attributes", {})
        self.out: dict[str, dict[str, set[str]]] = {}
        for s, r, o in graph["triples"]:
            self.out.setdefault(s, {}).setdefault(r, set()).add(o)

    @classmethod
    def load(cls, path: Path) -> LocalGraph:
        return cls(read_json(path, "the kg task's local graph"))

    def _set(self, program: Program, memo: dict[int, set[str]] | None = None) -> set[str]:
        """The program's entities; each shared sub-program is evaluated once (`memo`, by identity)."""
        memo = {} if memo is None else memo
        if id(program) not in memo:
            memo[id(program)] = self._eval(program, memo)
        return memo[id(program)]

    def _eval(self, program: Program, memo: dict[int, set[str]]) -> set[str]:
        op = program[0]
        if op == "ENT":
            return {program[1]} if program[1] in self.entities else set()
        if op == "JOIN":
            return {o for s in self._set(program[2], memo) for o in self.out.get(s, {}).get(program[1], ())}
        if op == "AND":
            return self._set(program[1], memo) & self._set(program[2], memo)
        if op == "COUNT":
            return {str(len(self._set(program[1], memo)))}
        if op in ("ARGMAX", "ARGMIN"):
            scored = {e: self.values[e][program[2]] for e in self._set(program[1], memo)
                      if program[2] in self.values.get(e, {})}
            if not scored:
                return set()
            best = max(scored.values()) if op == "ARGMAX" else min(scored.values())
            return {e for e, v in scored.items() if v == best}
        raise ValueError(f"unknown program {op!r}")

    def execute(self, program: Program) -> list[str]:
        return sorted(self._set(program))

    def relations(self, program: Program) -> list[str]:
        return sorted({r for e in self._set(program) for r in self.out.get(e, {})})

    def attributes(self, program: Program) -> list[str]:
        return sorted({a for e in self._set(program) for a in self.values.get(e, {})})

    def range_of(self, relation: str) -> str:
        return self.schema.get(relation, {}).get("range", "unknown")

