"""The `kg` task's SPARQL backend: programs run as SPARQL queries against a Freebase endpoint.

AgentBench serves Freebase from Virtuoso (`http://localhost:3001/sparql` in its configs); a user who
has that running sets `AGENTRL_KG_SPARQL_URL` and the `kg` task runs AgentBench's own questions.
Each program (see `program.Program`) becomes one graph pattern that binds a variable to its entities:

    ("ENT", "m.0abc")                    VALUES ?x0 { ns:m.0abc }
    ("JOIN", "r.s.t", p)                 <p on ?x1> ?x1 ns:r.s.t ?x0 .
    ("AND", p, q)                        <p on ?x0> <q on ?x0>
    ("ARGMAX", p, "a.b.c")               <p on ?x0> ?x0 ns:a.b.c ?v .
                                         { SELECT (MAX(?w) AS ?v) WHERE { <p on ?y> ?y ns:a.b.c ?w } }
    ("COUNT", p)                         SELECT (COUNT(DISTINCT ?x0) AS ?n) ...

Ids and relation names are checked against a strict pattern before they enter a query, so nothing
the model writes can change a query's shape. Relations exclude Freebase's bookkeeping namespaces
(`type.`, `common.`, `freebase.`, …); attributes are relations whose objects are numeric or date
literals; the type a relation leads to is its `type.property.expected_type`. Which ones AgentBench
lists differs a little (it intersects with its own ontology files), so observations can differ.

Not tested against a real Freebase here (none is reachable); the tests check the queries this builds
and the parsing of the standard SPARQL JSON results against a fake endpoint on localhost.
"""
from __future__ import annotations

import itertools
import json
import re
import urllib.parse
import urllib.request
from typing import Any

from agentrl.tasks.kg.program import NUMBER_TYPE, Program

NS = "http://rdf.freebase.com/ns/"
NAME = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)+$")
EXCLUDED_NAMESPACES = ("type.", "common.", "freebase.", "kg.", "base.ontologies.", "dataworld.", "user.")
DATE_TYPES = ("date", "gYear", "gYearMonth", "dateTime")
PREFIXES = "PREFIX ns: <http://rdf.freebase.com/ns/>\nPREFIX xsd: <http://www.w3.org/2001/XMLSchema#>\n"


def _name(value: str) -> str:
    if not NAME.match(value):
        raise ValueError(f"{value!r} is not a valid id or relation name")
    return f"ns:{value}"


class QueryBuilder:
    """Turns a program into a graph pattern over fresh variables ?x0, ?x1, …"""

    def __init__(self) -> None:
        self._fresh = itertools.count()

    def var(self) -> str:
        return f"?x{next(self._fresh)}"

    def pattern(self, program: Program, x: str) -> str:
        op = program[0]
        if op == "ENT":
            return f"VALUES {x} {{ {_name(program[1])} }}"
        if op == "JOIN":
            y = self.var()
            return f"{self.pattern(program[2], y)}\n{y} {_name(program[1])} {x} ."
        if op == "AND":
            return f"{self.pattern(program[1], x)}\n{self.pattern(program[2], x)}"
        if op in ("ARGMAX", "ARGMIN"):
            return self._extremum(program, x, "MAX" if op == "ARGMAX" else "MIN")
        raise ValueError(f"a {op} program has no entities to bind")

    def _extremum(self, program: Program, x: str, agg: str) -> str:
        """Every entity whose value equals the best one (ties kept, as the local graph does)."""
        v, y, w = self.var(), self.var(), self.var()
        return (f"{self.pattern(program[1], x)}\n{x} {_name(program[2])} {v} .\n"
                f"{{ SELECT ({agg}({w}) AS {v}) WHERE {{\n{self.pattern(program[1], y)}\n"
                f"{y} {_name(program[2])} {w} .\n}} }}")


def select_entities(program: Program) -> str:
    """The query for the entities (or the number, for COUNT) a program denotes."""
    qb = QueryBuilder()
    if program[0] == "COUNT":
        x = qb.var()
        return f"{PREFIXES}SELECT (COUNT(DISTINCT {x}) AS ?value) WHERE {{\n{qb.pattern(program[1], x)}\n}}"
    x = qb.var()
    return f"{PREFIXES}SELECT DISTINCT ({x} AS ?value) WHERE {{\n{qb.pattern(program, x)}\n}}"


def select_relations(program: Program) -> str:
    qb = QueryBuilder()
    x = qb.var()
    return (f"{PREFIXES}SELECT DISTINCT (?r AS ?value) WHERE {{\n{qb.pattern(program, x)}\n{x} ?r ?o .\n"
            f"FILTER(STRSTARTS(STR(?r), \"{NS}\"))\n}}")


def select_attributes(program: Program) -> str:
    qb = QueryBuilder()
    x = qb.var()
    dates = " || ".join(f"DATATYPE(?o) = xsd:{t}" for t in DATE_TYPES)
    return (f"{PREFIXES}SELECT DISTINCT (?r AS ?value) WHERE {{\n{qb.pattern(program, x)}\n{x} ?r ?o .\n"
            f"FILTER(isLiteral(?o) && (isNumeric(?o) || {dates}))\n}}")


def select_range(relation: str) -> str:
    return f"{PREFIXES}SELECT (?t AS ?value) WHERE {{ {_name(relation)} ns:type.property.expected_type ?t }} LIMIT 1"


def _strip(value: str) -> str:
    return value[len(NS):] if value.startswith(NS) else value


def _useful(relation: str) -> bool:
    return bool(NAME.match(relation)) and not relation.startswith(EXCLUDED_NAMESPACES)


class SparqlBackend:
    """`KGBackend` over a SPARQL endpoint (GET `?query=...`, SPARQL 1.1 JSON results)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._ranges: dict[str, str] = {}

    def query(self, sparql: str) -> list[str]:
        """The `?value` column of a SELECT, with Freebase's namespace stripped from URIs."""
        params = urllib.parse.urlencode({"query": sparql, "format": "json"})
        url = f"{self.url}{'&' if '?' in self.url else '?'}{params}"
        request = urllib.request.Request(url, headers={"Accept": "application/sparql-results+json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body: dict[str, Any] = json.load(response)
        except (OSError, ValueError) as e:
            # the endpoint is infrastructure: its failure must not read as the agent's mistake
            raise RuntimeError(f"SPARQL endpoint {self.url} failed: {e}") from e
        return [_strip(b["value"]["value"]) for b in body.get("results", {}).get("bindings", []) if "value" in b]

    def execute(self, program: Program) -> list[str]:
        return sorted(set(self.query(select_entities(program))))

    def relations(self, program: Program) -> list[str]:
        return sorted(r for r in set(self.query(select_relations(program))) if _useful(r))

    def attributes(self, program: Program) -> list[str]:
        return sorted(r for r in set(self.query(select_attributes(program))) if _useful(r))

    def range_of(self, relation: str) -> str:
        if relation not in self._ranges:
            found = self.query(select_range(relation))
            self._ranges[relation] = found[0] if found else "unknown"
        return self._ranges[relation]


__all__ = ["NUMBER_TYPE", "SparqlBackend", "select_attributes", "select_entities", "select_relations"]
