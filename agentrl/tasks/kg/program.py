"""What a `kg` variable holds: a program over entity sets, and what executes one (`KGBackend`).

A program is AgentBench's s-expression as nested tuples; the local graph (`graph`) and a Freebase
SPARQL endpoint (`sparql`) both execute it, and the episode builds it from the model's tool calls.
"""
from __future__ import annotations

from typing import Any, Protocol

NUMBER_TYPE = "type.int"

Program = tuple[Any, ...]
"""("ENT", id) | ("JOIN", relation, p) | ("AND", p, q) | ("COUNT", p) | ("ARGMAX"|"ARGMIN", p, attribute)."""
MAX_PROGRAM_NODES = 256
"""The most operations a variable's program may hold, counted as a tree (a variable used twice counts twice).
Variables share sub-programs, so `intersection(#k, #k)` doubles the tree: a chain of them would make
hashing the program, executing it and writing its SPARQL query exponential in the chain's length. A
real question's program is a few dozen operations at most (15 rounds); past the bound the call is
refused with an observation."""


def program_size(program: Program) -> int:
    """Operations in `program` counted as a tree, computed over the DAG (linear in distinct nodes)."""
    sizes: dict[int, int] = {}

    def size(p: Program) -> int:
        if id(p) not in sizes:
            sizes[id(p)] = 1 + sum(size(c) for c in p[1:] if isinstance(c, tuple))
        return sizes[id(p)]

    return size(program)


class KGBackend(Protocol):
    """What executes programs: the local graph or a SPARQL endpoint."""

    def execute(self, program: Program) -> list[str]:
        """Entity ids (or literal values) the program denotes, sorted."""
        ...

    def relations(self, program: Program) -> list[str]:
        ...

    def attributes(self, program: Program) -> list[str]:
        ...

    def range_of(self, relation: str) -> str:
        """The type of the entities a relation leads to."""
        ...

