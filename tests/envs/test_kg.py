"""The kg task: AgentBench-FC's tools and limits, our graph's expert, grading, malformed calls, the
AgentBench file format, and the SPARQL backend against a fake endpoint on localhost."""
from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agentrl.serving.session import Session
from agentrl.tasks import get_task
from agentrl.tasks.kg import KGTask, f1_score, load_samples, parse_action
from agentrl.tasks.kg.sparql import SparqlBackend, select_entities, select_relations
from agentrl.types import Status

ROOT = Path(__file__).resolve().parents[2]


def call(name: str, **args: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def text(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def play(session: Session) -> Any:
    while True:
        result = session.interact(session.expert_message())
        if result.done:
            return result


@pytest.fixture(scope="module")
def task() -> KGTask:
    return KGTask()


def test_tools_and_round_limit_are_agentbench_fc(task: KGTask) -> None:
    assert task.max_turns == 15
    params = {t["function"]["name"]: list(t["function"]["parameters"]["properties"]) for t in task.tools()}
    assert params == {"get_relations": ["variable"], "get_neighbors": ["variable", "relation"],
                      "intersection": ["variable1", "variable2"], "get_attributes": ["variable"],
                      "argmax": ["variable", "attribute"], "argmin": ["variable", "attribute"], "count": ["variable"]}
    for t in task.tools():
        p = t["function"]["parameters"]
        assert p["required"] == list(p["properties"]) and p["additionalProperties"] is False
        assert all(v["type"] == "string" for v in p["properties"].values())
    assert task.tools()[0]["function"]["description"].startswith("Fetches all relations associated with a given")


def test_expert_solves_all_of_our_samples(task: KGTask) -> None:
    assert (len(task.indices("train")), len(task.indices("test"))) == (600, 150)
    for index in task.indices("test") + task.indices("train")[:150]:
        r = play(Session(task, index))
        assert (r.reward, r.status, r.metrics["f1"]) == (1.0, Status.COMPLETED, 1.0), index
    assert isinstance(get_task("kg"), KGTask)


def test_committed_data_is_what_the_generator_gives() -> None:
    from agentrl.tasks.task_data import kg_files

    for rel, content in kg_files().items():
        assert (ROOT / "data" / rel).read_text() == content, rel


def test_f1_and_exact_match_by_hand() -> None:
    assert f1_score({"a", "b"}, {"a"}) == pytest.approx(2 / 3)  # precision 1/2, recall 1
    assert f1_score({"a"}, {"a", "b", "c", "d"}) == pytest.approx(0.4)  # precision 1, recall 1/4
    assert f1_score({"x"}, {"a"}) == 0.0 and f1_score({"a", "b"}, {"b", "a"}) == 1.0


def test_a_superset_answer_scores_f1_but_no_reward(task: KGTask) -> None:
    # "which films did X act in?": answering with the whole two-hop set instead, or a subset, is graded by set
    index = next(i for i in task.indices("test") if len(task.samples["test"][int(i.split("-")[1])].answer) >= 2
                 and task.samples["test"][int(i.split("-")[1])].actions[-1].startswith("get_neighbors"))
    sample = task.samples["test"][int(index.split("-")[1])]
    s = Session(task, index)
    for _ in sample.actions:
        s.interact(s.expert_message())
    last = len(s.episode.variables) - 1
    s.episode.variables.append(s.episode.variables[last].__class__(  # the answer set minus one entity
        "x", ("AND", s.episode.variables[last].program, ("ENT", sorted(sample.answer)[0]))))
    r = s.interact(text(f"Thought: done.\nFinal Answer: #{last + 1}"))
    n = len(sample.answer)
    assert (r.done, r.reward, r.status) == (True, 0.0, Status.COMPLETED)
    assert r.metrics["exact_match"] == 0.0 and r.metrics["f1"] == pytest.approx(2 * (1 / n) / (1 + 1 / n))


def test_malformed_and_out_of_order_calls_are_observations(task: KGTask) -> None:
    s = Session(task, "test-0")
    entity = next(iter(s.episode.sample.entities))
    r = s.interact(call("get_neighbors", variable=entity, relation="film.film.genre"))
    assert not r.done and r.messages[0]["content"].startswith("Error: get_neighbors cannot be executed:")
    assert "call get_relations" in r.messages[0]["content"]
    r = s.interact(call("get_relations", variable="Nobody In Particular"))
    assert "neither a variable" in r.messages[0]["content"]
    r = s.interact(call("count", variable="#4"))
    assert "#4 is not a variable (there are 0)" in r.messages[0]["content"]
    r = s.interact(call("get_relations", relation="x"))  # schema: variable missing
    assert r.messages[0]["content"].startswith("Error: invalid arguments for get_relations")
    r = s.interact(text("I think it is a film."))  # no tool call and no final answer
    assert not r.done and r.messages[0]["role"] == "user" and "call one of the tools" in r.messages[0]["content"]
    r = s.interact(call("get_relations", variable=entity))
    assert r.messages[0]["content"].startswith("Observation: [")
    r = s.interact(text("Final Answer: #7"))
    assert (r.done, r.reward, r.status) == (True, 0.0, Status.INVALID_ACTION)


def test_intersection_of_two_types_is_refused(task: KGTask) -> None:
    s = Session(task, "test-0")
    ep = s.episode
    ent = next(iter(ep.sample.entities.values()))
    rels = ep.backend.relations(("ENT", ent))
    s.interact(call("get_relations", variable=ent))
    s.interact(call("get_neighbors", variable=ent, relation=rels[0]))
    s.interact(call("count", variable="#0"))
    r = s.interact(call("intersection", variable1="#0", variable2="#1"))
    assert "different types" in r.messages[0]["content"] and len(ep.variables) == 2


def test_agentbench_file_format(tmp_path: Path) -> None:
    item = {"question": "what position did x play?", "qid": "1_grailqa", "source": "grailqa",
            "entities": {"X": "m.0x"}, "s_expression": "(JOIN a.b m.0x)",
            "actions": ["get_relations(m.0x)", "get_neighbors(m.0x,a.b)"],
            "answer": [{"answer_type": "Entity", "answer_argument": "m.05ch8k4", "entity_name": "Guard"}]}
    (tmp_path / "q.json").write_text(json.dumps([item]))
    [sample] = load_samples(tmp_path / "q.json")
    assert (sample.question, sample.entities, sample.answer, sample.qid) == (
        "what position did x play?", {"X": "m.0x"}, {"m.05ch8k4"}, "1_grailqa")
    assert parse_action("get_neighbors(#0, a.b.c)") == ("get_neighbors", {"variable": "#0", "relation": "a.b.c"})
    assert parse_action("count(#2)") == ("count", {"variable": "#2"})
    (tmp_path / "bad.json").write_text(json.dumps([{"question": "q"}]))
    with pytest.raises(ValueError, match="AgentBench's KG format"):
        load_samples(tmp_path / "bad.json")
    dev = load_samples(ROOT / "data/agentbench/knowledgegraph/dev.json")
    assert len(dev) == 20 and dev[0].answer == {"m.05ch8k4"} and len(dev[0].actions) == 7


def test_agentbench_source_needs_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRL_KG_SPARQL_URL", raising=False)
    with pytest.raises(ValueError, match="SPARQL endpoint"):
        KGTask(source="agentbench")
    with pytest.raises(ValueError, match="unknown source"):
        KGTask(source="freebase")


# ------------------------------------------------------------------------------------------ SPARQL

def test_query_building() -> None:
    q = select_entities(("JOIN", "film.film.genre", ("ENT", "m.0f1")))
    assert q.endswith("SELECT DISTINCT (?x0 AS ?value) WHERE {\nVALUES ?x1 { ns:m.0f1 }\n?x1 ns:film.film.genre ?x0 .\n}")
    q = select_entities(("COUNT", ("AND", ("ENT", "m.a"), ("ENT", "m.b"))))
    assert "SELECT (COUNT(DISTINCT ?x0) AS ?value) WHERE {\nVALUES ?x0 { ns:m.a }\nVALUES ?x0 { ns:m.b }\n}" in q
    q = select_entities(("ARGMAX", ("ENT", "m.a"), "p.q.r"))
    assert "?x0 ns:p.q.r ?x1 .\n{ SELECT (MAX(?x3) AS ?x1) WHERE {\nVALUES ?x2 { ns:m.a }\n?x2 ns:p.q.r ?x3 ." in q
    assert "FILTER(STRSTARTS(STR(?r), \"http://rdf.freebase.com/ns/\"))" in select_relations(("ENT", "m.a"))
    for hostile in ("m.a } . ?s ?p ?o", "m.a\nDROP ALL", "<http://x>"):  # nothing typed changes a query's shape
        with pytest.raises(ValueError, match="not a valid id"):
            select_entities(("ENT", hostile))


class FakeFreebase(BaseHTTPRequestHandler):
    """Answers AgentBench's dev question 0 the way a Freebase endpoint would, and records the queries."""

    queries: list[str] = []
    fail = False

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        self.queries.append(query)
        ns = "http://rdf.freebase.com/ns/"
        if self.fail:
            self.send_error(500, "virtuoso is down")
            return
        if "?r ?o" in query:  # relations of a program (plus a bookkeeping one the task must hide)
            values = [ns + r for r in ("media_common.quotation.author", "basketball.basketball_player.position_s",
                                       "type.object.type")]
        elif "expected_type" in query:
            values = [ns + ("people.person" if "quotation.author" in query else "basketball.basketball_position")]
        else:
            values = [ns + "m.05ch8k4"]
        body = {"head": {"vars": ["value"]},
                "results": {"bindings": [{"value": {"type": "uri", "value": v}} for v in values]}}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/sparql-results+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def endpoint() -> Iterator[str]:
    FakeFreebase.queries, FakeFreebase.fail = [], False
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeFreebase)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/sparql"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_agentbench_dev_question_over_a_sparql_endpoint(endpoint: str) -> None:
    task = KGTask(source="agentbench", sparql_url=endpoint)
    assert task.indices("dev")[:2] == ["dev-0", "dev-1"] and len(task.indices("dev")) == 20
    s = Session(task, "dev-0")
    assert s.messages[1]["content"].endswith("\nEntities: [Did you see that thing? That’s Sidat-Singh! The Syracuse "
                                             "Walking Dream!, Pat Connaughton]")
    r = s.interact(s.expert_message())
    assert r.messages[0]["content"] == ("Observation: [basketball.basketball_player.position_s, "
                                        "media_common.quotation.author]")
    r = play(s)
    assert (r.reward, r.status, r.metrics["f1"]) == (1.0, Status.COMPLETED, 1.0)
    final = FakeFreebase.queries[-1]
    assert final.startswith("PREFIX ns: <http://rdf.freebase.com/ns/>") and "VALUES ?x" in final
    assert "ns:basketball.basketball_player.position_s" in final and "ns:m.0j50kb6" in final


def test_endpoint_failure_is_an_env_error_not_the_agents(endpoint: str) -> None:
    assert SparqlBackend(endpoint).relations(("ENT", "m.0j50kb6"))[0] == "basketball.basketball_player.position_s"
    FakeFreebase.fail = True
    s = Session(KGTask(source="agentbench", sparql_url=endpoint), "dev-0")
    r = s.interact(s.expert_message())
    assert (r.done, r.status) == (True, Status.ENV_ERROR) and "SPARQL endpoint" in (r.error or "")


def calls(*named: tuple[str, dict[str, str]]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for i, (name, args) in enumerate(named)]}


def test_self_intersection_chains_are_bounded_and_linear(task: KGTask) -> None:
    """`intersection(#k, #k)` doubles a program's tree per level; on c07c523 a chain of them
    (16 calls a message) made the next query exponential and froze the worker. Now a program past
    MAX_PROGRAM_NODES is refused with an observation, and shared sub-programs are evaluated once."""
    s = Session(task, "test-0")
    ent = next(iter(s.episode.sample.entities))
    s.interact(call("get_relations", variable=ent))
    rel = s.episode.backend.relations(("ENT", s.episode.sample.entities[ent]))[0]
    s.interact(call("get_neighbors", variable=ent, relation=rel))
    done: list[Any] = []

    def chain() -> None:
        for level in range(0, 48, 16):
            done.append(s.interact(calls(*[("intersection", {"variable1": f"#{k}", "variable2": f"#{k}"})
                                           for k in range(level, level + 16)])))
        done.append(s.interact(calls(("get_relations", {"variable": f"#{len(s.episode.variables) - 1}"}))))

    worker = threading.Thread(target=chain, daemon=True)
    worker.start()
    worker.join(timeout=10.0)
    assert not worker.is_alive(), "a chain of self-intersections did not finish in 10 s"
    from agentrl.tasks.kg import MAX_PROGRAM_NODES, LocalGraph, program_size

    refused = [m["content"] for r in done[:3] for m in r.messages if "operations; at most" in m["content"]]
    assert refused and all(program_size(v.program) <= MAX_PROGRAM_NODES for v in s.episode.variables)
    assert len(s.episode.variables) == 7  # #0 (2 operations) and six doublings; the seventh (383) is refused
    assert done[-1].messages[0]["content"].startswith("Observation: [")
    # evaluation by identity: a DAG of 200 levels (a tree of 2**200 nodes) runs in linear time
    graph: LocalGraph = s.episode.backend
    p: tuple[Any, ...] = ("JOIN", rel, ("ENT", s.episode.sample.entities[ent]))
    for _ in range(200):
        p = ("AND", p, p)
    assert graph.execute(p) == graph.execute(("JOIN", rel, ("ENT", s.episode.sample.entities[ent])))


def test_a_variable_of_thousands_of_digits_names_none(task: KGTask) -> None:
    """`Final Answer: #<4,301 digits>` raised Python's bound on converting integers out of the
    step (env_error); it names no variable, as `#999` does."""
    huge = "#" + "9" * 4301
    s = Session(task, task.indices("test")[0])
    r = s.interact(call("get_relations", variable=huge))
    assert not r.done and "is not a variable" in r.messages[0]["content"]
    r = s.interact(text(f"Final Answer: {huge}"))
    assert (r.done, r.status, r.reward) == (True, Status.INVALID_ACTION, 0.0) and "over_budget" not in r.metrics
