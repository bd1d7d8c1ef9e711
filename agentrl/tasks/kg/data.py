"""The `kg` task's offline data: a small Freebase-like graph and questions over it, from a fixed seed.

`generate(seed)` gives (and `make(out_dir, seed)` writes) `graph.json` (see `graph.LocalGraph`) and
`train.json` / `test.json` in AgentBench's KG format, so that the same loader reads them and
AgentBench's own files. The world: countries with capitals and populations, people with
nationalities and birth years, films with directors, actors, genres, producing countries, runtimes
and release years; each relation present in both directions under Freebase-style names
(`film.film.directed_by` / `film.director.film`) and with a range type, so intersecting two variables
of different types fails as in Freebase. Question templates cover every tool: one and two hops,
intersections, count, argmax and argmin; each records the `actions` that answer it (the expert
replays them) and its gold answer, computed by executing the same program on the graph. Test
questions are never train questions.
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.tasks.kg.graph import LocalGraph
from agentrl.tasks.kg.program import Program

SYLLABLES = ("ka", "lo", "mi", "ren", "so", "ta", "vel", "dor", "an", "is", "bar", "eth", "qu", "ol", "un",
             "zi", "mar", "tes", "fen", "gal", "hor", "ny", "pra", "sil", "cor", "dun", "el", "wyn", "ro", "ba")
FILM_WORDS = ("Harbor", "Silver", "Night", "Garden", "River", "Echo", "Winter", "Lantern", "Storm", "Glass",
              "Crown", "Shadow", "Summer", "Iron", "Paper", "Moon", "Desert", "Golden", "Hidden", "Last",
              "Northern", "Quiet", "Broken", "Wild", "Secret", "Burning", "Distant", "Velvet", "Stone", "Blue")
GENRES = ("drama", "comedy", "thriller", "documentary", "western", "musical", "horror", "science fiction",
          "animation", "romance")

RELATIONS: dict[str, tuple[str, str]] = {  # name -> (domain, range)
    "film.film.directed_by": ("film.film", "film.director"),
    "film.director.film": ("film.director", "film.film"),
    "film.film.starring": ("film.film", "film.actor"),
    "film.actor.film": ("film.actor", "film.film"),
    "film.film.genre": ("film.film", "film.film_genre"),
    "film.film_genre.films_in_this_genre": ("film.film_genre", "film.film"),
    "film.film.country": ("film.film", "location.country"),
    "location.country.films_produced": ("location.country", "film.film"),
    "people.person.nationality": ("people.person", "location.country"),
    "location.country.nationals": ("location.country", "people.person"),
    "location.country.capital": ("location.country", "location.citytown"),
    "location.citytown.capital_of": ("location.citytown", "location.country"),
}
INVERSE = {"film.film.directed_by": "film.director.film", "film.film.starring": "film.actor.film",
           "film.film.genre": "film.film_genre.films_in_this_genre",
           "film.film.country": "location.country.films_produced",
           "people.person.nationality": "location.country.nationals",
           "location.country.capital": "location.citytown.capital_of"}


def _word(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()


def make_graph(rng: random.Random, countries: int = 16, people: int = 110, films: int = 160) -> dict[str, Any]:
    entities: dict[str, dict[str, str]] = {}
    attributes: dict[str, dict[str, float]] = {}
    triples: list[list[str]] = []
    used: set[str] = set()

    def add(kind: str, name: str, type_: str) -> str:
        while name in used:  # names are unique, so a question's entity names are unambiguous
            name = f"{name} {_word(rng, 1)}"
        used.add(name)
        eid = f"m.{kind}{len(entities):04d}"
        entities[eid] = {"name": name, "type": type_}
        return eid

    def link(s: str, r: str, o: str) -> None:
        triples.append([s, r, o])
        triples.append([o, INVERSE[r], s])

    genre_ids = [add("g", g, "film.film_genre") for g in GENRES]
    country_ids = []
    for _ in range(countries):
        c = add("c", _word(rng, 2) + "ia", "location.country")
        country_ids.append(c)
        city = add("t", _word(rng, 2), "location.citytown")
        link(c, "location.country.capital", city)
        attributes[c] = {"location.statistical_region.population": float(rng.randrange(200_000, 90_000_000))}
    person_ids = []
    for _ in range(people):
        p = add("p", f"{_word(rng, 2)} {_word(rng, 2)}", "people.person")
        person_ids.append(p)
        link(p, "people.person.nationality", rng.choice(country_ids))
        attributes[p] = {"people.person.date_of_birth": float(rng.randrange(1920, 2001))}
    directors = person_ids[: people // 3]
    actors = person_ids[people // 4:]
    for _ in range(films):
        f = add("f", f"The {rng.choice(FILM_WORDS)} {rng.choice(FILM_WORDS)}", "film.film")
        link(f, "film.film.directed_by", rng.choice(directors))
        for a in rng.sample(actors, rng.randint(2, 4)):
            link(f, "film.film.starring", a)
        link(f, "film.film.genre", rng.choice(genre_ids))
        link(f, "film.film.country", rng.choice(country_ids))
        attributes[f] = {"film.film.runtime": float(rng.randrange(70, 200)),
                         "film.film.initial_release_date": float(rng.randrange(1950, 2024))}
    relations = {r: {"domain": d, "range": g} for r, (d, g) in RELATIONS.items()}
    return {"entities": entities, "relations": relations, "triples": triples, "attributes": attributes}


# -------------------------------------------------------------------------------- question templates
# Each template picks its anchor entities and returns (question, anchors, actions, program) or None.

Template = Callable[[random.Random, dict[str, list[str]], LocalGraph], tuple[str, list[str], list[str], Program] | None]


def _hop(e: str, r: str) -> Program:
    return ("JOIN", r, ("ENT", e))


def _one_hop(rng, by_type, g):  # type: ignore[no-untyped-def]
    f = rng.choice(by_type["film.film"])
    rel, ask = rng.choice([("film.film.directed_by", "who directed {}?"),
                           ("film.film.starring", "who starred in {}?"),
                           ("film.film.genre", "what genre is {}?"),
                           ("film.film.country", "which country produced {}?")])
    return ask.format(g.entities[f]["name"]), [f], [f"get_relations({f})", f"get_neighbors({f},{rel})"], _hop(f, rel)


def _reverse_hop(rng, by_type, g):  # type: ignore[no-untyped-def]
    p = rng.choice(by_type["people.person"])
    rel, ask = rng.choice([("film.director.film", "which films were directed by {}?"),
                           ("film.actor.film", "which films did {} act in?")])
    return ask.format(g.entities[p]["name"]), [p], [f"get_relations({p})", f"get_neighbors({p},{rel})"], _hop(p, rel)


def _two_hop(rng, by_type, g):  # type: ignore[no-untyped-def]
    f = rng.choice(by_type["film.film"])
    r1, r2, ask = rng.choice([
        ("film.film.directed_by", "people.person.nationality", "what is the nationality of the director of {}?"),
        ("film.film.country", "location.country.capital", "what is the capital of the country that produced {}?"),
        ("film.film.starring", "people.person.nationality", "which countries are the actors of {} from?")])
    actions = [f"get_relations({f})", f"get_neighbors({f},{r1})", "get_relations(#0)", f"get_neighbors(#0,{r2})"]
    return ask.format(g.entities[f]["name"]), [f], actions, ("JOIN", r2, _hop(f, r1))


def _intersection(rng, by_type, g):  # type: ignore[no-untyped-def]
    gen, c = rng.choice(by_type["film.film_genre"]), rng.choice(by_type["location.country"])
    ask = f"which {g.entities[gen]['name']} films were produced in {g.entities[c]['name']}?"
    r1, r2 = "film.film_genre.films_in_this_genre", "location.country.films_produced"
    actions = [f"get_relations({gen})", f"get_neighbors({gen},{r1})", f"get_relations({c})",
               f"get_neighbors({c},{r2})", "intersection(#0,#1)"]
    return ask, [gen, c], actions, ("AND", _hop(gen, r1), _hop(c, r2))


def _count(rng, by_type, g):  # type: ignore[no-untyped-def]
    if rng.random() < 0.5:
        p = rng.choice(by_type["people.person"])
        rel, ask = rng.choice([("film.director.film", "how many films did {} direct?"),
                               ("film.actor.film", "how many films has {} acted in?")])
        actions = [f"get_relations({p})", f"get_neighbors({p},{rel})", "count(#0)"]
        return ask.format(g.entities[p]["name"]), [p], actions, ("COUNT", _hop(p, rel))
    c = rng.choice(by_type["location.country"])
    ask = f"how many people are nationals of {g.entities[c]['name']}?"
    actions = [f"get_relations({c})", f"get_neighbors({c},location.country.nationals)", "count(#0)"]
    return ask, [c], actions, ("COUNT", _hop(c, "location.country.nationals"))


def _superlative(rng, by_type, g):  # type: ignore[no-untyped-def]
    p = rng.choice(by_type["people.person"])
    rel = rng.choice(["film.director.film", "film.actor.film"])
    who = "directed by" if rel == "film.director.film" else "starring"
    op, attr, ask = rng.choice([
        ("argmax", "film.film.runtime", "what is the longest film {} {}?"),
        ("argmin", "film.film.runtime", "what is the shortest film {} {}?"),
        ("argmax", "film.film.initial_release_date", "what is the most recent film {} {}?"),
        ("argmin", "film.film.initial_release_date", "what is the earliest film {} {}?")])
    actions = [f"get_relations({p})", f"get_neighbors({p},{rel})", "get_attributes(#0)", f"{op}(#0,{attr})"]
    return ask.format(who, g.entities[p]["name"]), [p], actions, (op.upper(), _hop(p, rel), attr)


def _superlative_country(rng, by_type, g):  # type: ignore[no-untyped-def]
    c = rng.choice(by_type["location.country"])
    op, ask = rng.choice([("argmin", "who is the oldest national of {}?"),
                          ("argmax", "who is the youngest national of {}?")])
    attr = "people.person.date_of_birth"
    actions = [f"get_relations({c})", f"get_neighbors({c},location.country.nationals)", "get_attributes(#0)",
               f"{op}(#0,{attr})"]
    return ask.format(g.entities[c]["name"]), [c], actions, (op.upper(), _hop(c, "location.country.nationals"), attr)


TEMPLATES: tuple[Template, ...] = (_one_hop, _reverse_hop, _two_hop, _intersection, _count, _superlative,
                                   _superlative_country)


def make_questions(graph: dict[str, Any], rng: random.Random, n: int, seen: set[str],
                   max_misses: int = 200) -> list[dict[str, Any]]:
    """`n` distinct questions not in `seen` with non-empty answers of at most 12 entities.

    Templates take turns; one that misses `max_misses` times in a row (its distinct questions are used
    up, e.g. a template over 16 countries) drops out, and running out of templates is an error rather
    than a loop without end.
    """
    g = LocalGraph(graph)
    by_type: dict[str, list[str]] = {}
    for eid, e in graph["entities"].items():
        by_type.setdefault(e["type"], []).append(eid)
    out: list[dict[str, Any]] = []
    misses = [0] * len(TEMPLATES)
    turn = 0
    while len(out) < n:
        live = [i for i, m in enumerate(misses) if m < max_misses]
        if not live:
            raise ValueError(f"the graph yields only {len(out)} new questions, {n} were asked for")
        i = live[turn % len(live)]
        turn += 1
        question, anchors, actions, program = TEMPLATES[i](rng, by_type, g)
        answer = g.execute(program)
        if question in seen or not answer or len(answer) > 12 or (program[0] == "COUNT" and answer == ["0"]):
            misses[i] += 1
            continue
        misses[i] = 0
        seen.add(question)
        kind = "Value" if program[0] == "COUNT" else "Entity"
        out.append({
            "question": question, "qid": f"agentrl_kg_{len(seen)}", "source": "agentrl",
            "entities": {graph["entities"][a]["name"]: a for a in anchors},
            "actions": actions,
            "answer": [{"answer_type": kind, "answer_argument": a,
                        "entity_name": graph["entities"][a]["name"] if kind == "Entity" else a} for a in answer]})
    return out


def generate(seed: int = 0, train: int = 600, test: int = 150) -> dict[str, str]:
    """{file name: content} of graph.json, train.json and test.json (the same bytes for the same seed)."""
    rng = random.Random(f"kg:{seed}")
    graph = make_graph(rng)
    seen: set[str] = set()
    # test first, so that changing the train size never changes the test questions
    splits = {"test": make_questions(graph, rng, test, seen), "train": make_questions(graph, rng, train, seen)}
    return {f"{name}.json": json.dumps(obj, separators=(",", ":"), sort_keys=True) + "\n"
            for name, obj in (("graph", graph), *splits.items())}


def make(out_dir: Path, seed: int = 0, train: int = 600, test: int = 150) -> dict[str, int]:
    """Write `generate(...)`'s files under `out_dir`; returns their sizes in bytes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for name, content in generate(seed, train, test).items():
        (out_dir / name).write_text(content)
        sizes[name] = len(content.encode())
    return sizes
