"""One evaluation end to end: players for the targets, the scope's episodes scored into a results file, the tables.

    settings     temperature (the rollout's; --greedy: 0 and one run), limits, retries, protocol
    players      a local model: `VLLMEngine` + the model's `ChatFormat` through `run_episode`;
                 an endpoint: `ChatEndpoint` through the message-level loop
    score        `runner.score` into OUT/<stem>.jsonl, resumed from it, each episode's conversation into
                 OUT/<stem>.transcripts.jsonl.gz (`monitor.eval_transcripts`; `jobs.show_trajectories OUT`)
    tables       `eval_tables.write_tables`: <stem>.{txt,json,csv,md}

Cross-sampling scores three arms (A alone, B alone, cross) into <stem>-{A,B,cross}.jsonl and writes the
pass@k curves (`cross.curves`) as <stem>-curves.{json,md,png}, beside each arm's own tables.
"""
from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrl.evaluation import cross
from agentrl.evaluation.endpoint import ChatEndpoint
from agentrl.evaluation.players import EndpointPlayer, ExpertPlayer, LocalPlayer
from agentrl.evaluation.runner import EvalScope, progress_for, scope_keys, score
from agentrl.evaluation.targets import Target
from agentrl.monitor.eval_results import ResultsFile, aggregate, read_results
from agentrl.monitor.eval_tables import terminal_table, write_tables
from agentrl.monitor.eval_transcripts import TranscriptFile, transcripts_path
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.collect import Retry

log = logging.getLogger("agentrl.evaluation")


@dataclass(frozen=True)
class Settings:
    temperature: float
    top_p: float
    limits: EpisodeLimits
    retry: Retry
    protocol: str = "faithful"
    tool_parser: str = "auto"
    """The model settings of a local target, as a run's `model.*` (the same overrides: jobs.eval model.x=...)."""
    chat_template: str = ""
    stop_tokens: tuple[str, ...] = ()
    template_kwargs: tuple[tuple[str, Any], ...] = ()
    template_check: str = "warn"
    kv_cache_gib: int = 1
    seed: int = 0
    engine_options: tuple[tuple[str, Any], ...] = ()
    """More `VLLMEngine` arguments, e.g. (("dtype", "bfloat16"),) on a GPU (its defaults are the CPU's)."""

    def fingerprint(self, scope: EvalScope, targets: list[Target]) -> dict[str, Any]:
        """What a results file's episodes depend on: a rerun with another fingerprint must not resume it."""
        return {"targets": [t.describe() for t in targets], "split": scope.split, "temperature": self.temperature,
                "top_p": self.top_p, "limits": asdict(self.limits), "protocol": self.protocol,
                "tool_parser": self.tool_parser, "engine": dict(self.engine_options),
                **({"chat_template": self.chat_template} if self.chat_template else {}),
                **({"stop_tokens": list(self.stop_tokens)} if self.stop_tokens else {}),
                **({"template_kwargs": dict(self.template_kwargs)} if self.template_kwargs else {})}


def check_resumable(meta_path: Path, fingerprint: dict[str, Any]) -> None:
    """Write the fingerprint beside a new results file; refuse one written with other settings."""
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if old != fingerprint:
            diff = sorted(k for k in old.keys() | fingerprint.keys() if old.get(k) != fingerprint.get(k))
            raise ValueError(f"{meta_path.with_suffix('').with_suffix('.jsonl')} was scored with other settings "
                             f"({', '.join(diff)}): pass --fresh to replace it, or --out for another directory")
        return
    meta_path.parent.mkdir(parents=True, exist_ok=True)
    meta_path.write_text(json.dumps(fingerprint, indent=2))


def load_format(target: Target, settings: Settings) -> Any:
    """The chat format of a local target under the evaluation's model settings."""
    from agentrl.rollout.chat import ChatFormat

    assert target.model_dir is not None
    return ChatFormat.load(target.model_dir, settings.tool_parser, settings.stop_tokens, settings.template_check,
                           dict(settings.template_kwargs), settings.chat_template)


async def check_fit(client: Any, fmt: Any, scope: EvalScope, settings: Settings) -> None:
    """Refuse an evaluation whose every first prompt of a task (of its first indices) cannot fit max_model_len with
    a turn (it could score nothing but context_limit); warn when some cannot."""
    from agentrl.rollout.model_check import first_prompts, prompts_too_long

    lengths = await first_prompts(client, fmt, scope.tasks, scope.split)
    lim = settings.limits
    if (problem := prompts_too_long(lengths, lim.max_model_len, lim.max_new_tokens, every=True)) is not None:
        raise ValueError(problem)
    if (problem := prompts_too_long(lengths, lim.max_model_len, lim.max_new_tokens)) is not None:
        log.warning("some episodes will end as context_limit at once: %s", problem)


@contextlib.asynccontextmanager
async def local_model(target: Target, settings: Settings, concurrency: int, fmt: Any = None
                      ) -> AsyncIterator[tuple[Any, Any]]:
    """(engine, chat format) of a local target, the engine closed on the way out."""
    from agentrl.rollout.engine import VLLMEngine

    fmt = fmt or load_format(target, settings)
    engine = VLLMEngine(str(target.model_dir), settings.limits.max_model_len, max_num_seqs=concurrency,
                        kv_cache_gib=settings.kv_cache_gib, seed=settings.seed, **dict(settings.engine_options))
    try:
        yield engine, fmt
    finally:
        engine.close()


@contextlib.asynccontextmanager
async def chat_policy(target: Target, settings: Settings, concurrency: int) -> AsyncIterator[Any]:
    """A message-level policy (`reply`) of any target: the endpoint, or a local model behind `LocalChat`."""
    if target.is_endpoint:
        ep = ChatEndpoint(str(target.base_url), str(target.model), target.api_key())
        try:
            yield ep
        finally:
            await ep.close()
        return
    async with local_model(target, settings, concurrency) as (engine, fmt):
        yield cross.LocalChat(engine, fmt, settings.limits.max_model_len)


@contextlib.asynccontextmanager
async def player_of(client: Any, target: Target, settings: Settings, scope: EvalScope) -> AsyncIterator[Any]:
    """The player of one target: local models through the token-level agent loop (after `check_fit`), endpoints
    (and the scripted expert) at the message level."""
    concurrency = scope.concurrency
    if target.expert:
        yield ExpertPlayer(client, settings.limits, settings.retry)
        return
    if target.is_endpoint:
        async with chat_policy(target, settings, concurrency) as ep:
            yield EndpointPlayer(client, ep, settings.temperature, settings.top_p, settings.limits, settings.retry)
        return
    from agentrl.rollout.engine import SamplingConfig

    fmt = load_format(target, settings)
    await check_fit(client, fmt, scope, settings)
    async with local_model(target, settings, concurrency, fmt) as (engine, fmt):
        sampling = SamplingConfig(settings.limits.max_new_tokens, settings.temperature, settings.top_p, fmt.stop_ids)
        yield LocalPlayer(client, engine, fmt, sampling, settings.limits, settings.retry)


async def score_into(player: Any, keys: list, path: Path, fingerprint: dict[str, Any], concurrency: int,
                     progress: bool | None, shared: contextlib.AbstractAsyncContextManager[Any] | None = None,
                     label: str = "", **extra: object) -> ResultsFile:
    """Score the keys not yet in the results file at `path`, their transcripts beside it; returns the (closed)
    results file with every episode. `shared` and `label`: `runner.score`'s and `runner.progress_for`'s (other
    evaluations at once: a slot they share, the lines told apart)."""
    check_resumable(path.with_suffix(".meta.json"), fingerprint)
    with ResultsFile(path) as rf, TranscriptFile(transcripts_path(path)) as tf:
        already = len([k for k in keys if k in rf.done])
        if already:
            log.info("%s: %d of %d episodes already scored; scoring the other %d", path, already, len(keys),
                     len(keys) - already)
        bar = progress_for(keys, rf, label, bars=progress)
        try:
            await score(player, keys, rf, concurrency, bar, tf, shared, **extra)
        finally:
            bar.close()
    return rf


def tables(rf: ResultsFile, keys: list, out: Path, stem: str, label: str, bootstrap: int = 0) -> str:
    """Aggregate the episodes in scope of `rf` and write the tables; returns the terminal table."""
    in_scope = set(keys)
    eps = [e for e in rf.episodes if e.key in in_scope]
    runs = max((k[3] for k in keys), default=0) + 1
    results = aggregate(eps, ks=range(1, runs + 1), bootstrap_resamples=bootstrap)
    write_tables(results, out, stem, label=label)
    return terminal_table(results)


async def evaluate(client: Any, target: Target, scope: EvalScope, settings: Settings, out: Path, stem: str,
                   progress: bool | None = None, bootstrap: int = 0) -> str:
    """Score `target` on `scope` into OUT/<stem>.jsonl and write its tables; returns the terminal table."""
    keys = await scope_keys(client, scope)
    path = out / f"{stem}.jsonl"
    done = {e.key for e in read_results(path)}
    if all(k in done for k in keys):  # nothing left: the tables again, without starting an engine
        check_resumable(path.with_suffix(".meta.json"), settings.fingerprint(scope, [target]))
        log.info("%s: all %d episodes already scored", path, len(keys))
        with ResultsFile(path) as rf:
            return tables(rf, keys, out, stem, target.label, bootstrap)
    async with player_of(client, target, settings, scope) as player:
        rf = await score_into(player, keys, path, settings.fingerprint(scope, [target]), scope.concurrency, progress)
    return tables(rf, keys, out, stem, target.label, bootstrap)


async def evaluate_cross(client: Any, a: Target, b: Target, prob: float, scope: EvalScope, settings: Settings,
                         out: Path, stem: str, progress: bool | None = None) -> str:
    """The three arms of cross-sampling (A, B, and each turn from B with probability `prob`), then the pass@k
    curves of single A, single B, mix and cross for k = 1..runs; returns the curves as markdown.

    Each local model is loaded once for all three arms. Two local models of one chat format cross at the
    token level through `EnginePool` (as training's lagging pool does); otherwise each side is a message-level
    policy (`LocalChat` for a local one) and `RoutedEndpoint` alternates them. Alone, each side plays as
    `evaluate` would play it."""
    from agentrl.rollout.engine import SamplingConfig
    from agentrl.rollout.engine_pool import EnginePool

    keys = await scope_keys(client, scope)
    files: dict[str, ResultsFile] = {}
    async with contextlib.AsyncExitStack() as stack:
        local = {}
        for t in (a, b):
            if not t.is_endpoint:
                fmt = load_format(t, settings)
                await check_fit(client, fmt, scope, settings)
                local[t] = await stack.enter_async_context(local_model(t, settings, scope.concurrency, fmt))
        endpoints = {t: await stack.enter_async_context(chat_policy(t, settings, scope.concurrency))
                     for t in (a, b) if t.is_endpoint}

        def sampling(fmt: Any) -> SamplingConfig:
            return SamplingConfig(settings.limits.max_new_tokens, settings.temperature, settings.top_p, fmt.stop_ids)

        def alone(t: Target) -> Any:
            if t in endpoints:
                return EndpointPlayer(client, endpoints[t], settings.temperature, settings.top_p, settings.limits,
                                      settings.retry)
            engine, fmt = local[t]
            return LocalPlayer(client, engine, fmt, sampling(fmt), settings.limits, settings.retry)

        for arm, target in (("A", a), ("B", b)):
            files[arm] = await score_into(alone(target), keys, out / f"{stem}-{arm}.jsonl",
                                          settings.fingerprint(scope, [target]), scope.concurrency, progress, arm=arm)
            tables(files[arm], keys, out, f"{stem}-{arm}", target.label)
        seed = f"cross/{settings.seed}"
        if a in local and b in local and same_format(local[a][1], local[b][1]):
            (ea, fa), (eb, _) = local[a], local[b]
            crossed: Any = LocalPlayer(client, EnginePool(ea, [eb], prob, seed=seed), fa, sampling(fa),
                                       settings.limits, settings.retry)
        else:
            def side(t: Target) -> Any:
                return endpoints[t] if t in endpoints else cross.LocalChat(*local[t], settings.limits.max_model_len)
            crossed = EndpointPlayer(client, cross.RoutedEndpoint(side(a), side(b), prob, seed=seed),
                                     settings.temperature, settings.top_p, settings.limits, settings.retry)
        fp = {**settings.fingerprint(scope, [a, b]), "cross_prob": prob}
        files["cross"] = await score_into(crossed, keys, out / f"{stem}-cross.jsonl", fp, scope.concurrency, progress,
                                          arm="cross")
    tables(files["cross"], keys, out, f"{stem}-cross", f"{a.label} x {b.label} (p={prob:g})")
    in_scope = set(keys)
    c = cross.curves({arm: [e for e in rf.episodes if e.key in in_scope] for arm, rf in files.items()}, scope.runs)
    (out / f"{stem}-curves.json").write_text(json.dumps({"A": a.label, "B": b.label, "prob": prob, "curves": c},
                                                        indent=2))
    md = cross.curves_markdown(c, a.label, b.label, prob)
    (out / f"{stem}-curves.md").write_text(md)
    if c:
        from agentrl.evaluation.cross_plot import plot_curves

        plot_curves(c, out / f"{stem}-curves.png", f"A = {a.label}, B = {b.label}, p = {prob:g}")
    return md


def same_format(fa: Any, fb: Any) -> bool:
    """Whether two chat formats can share one episode's tokens (the same vocabulary and template)."""
    return fa.tokenizer.get_vocab() == fb.tokenizer.get_vocab() and \
        fa.tokenizer.chat_template == fb.tokenizer.chat_template
