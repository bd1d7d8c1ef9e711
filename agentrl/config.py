"""One typed config tree for a run: frozen dataclasses, YAML presets, command-line overrides.

`load_config("demo", ["trainer.lr=1e-5"])` reads `agentrl/presets/demo.yaml`, applies the overrides
(dotted paths, values parsed as YAML scalars), checks every field's type and range, and returns a frozen
`RunConfig`. Any problem raises `ConfigError` naming the field, at load time, before a process starts.
Each role receives only its own sub-config.
"""
from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

PRESETS_DIR = Path(__file__).parent / "presets"


class ConfigError(ValueError):
    """A bad config value; the message starts with the dotted field path."""


def _check(cond: bool, path: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{path}: {msg}")


@dataclass(frozen=True)
class ModelConfig:
    path: str = ""
    """A Hugging Face model directory. Empty: the run builds its own tiny model (below) under run_dir/model."""
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    """head_dim = hidden_size / num_heads must be 64 or more (vLLM's CPU attention rejects smaller)."""
    intermediate_size: int = 512
    vocab_size: int = 1024
    """Size of the byte-level BPE vocabulary trained on the task text."""
    max_position: int = 1024
    rope_theta: float = 10000.0
    """RoPE base. A tiny from-scratch model learns to copy from its context far sooner with a small base
    (sharper relative positions); the demo uses 100."""
    copy_init: float = 1.0
    """The built model's first attention layer starts as copy heads (value and output projections are
    identities, the value scaled by this); 0: plain random init. See `agentrl.models.tiny.init_copy_heads`."""
    tool_parser: str = "auto"
    """vLLM's tool-call parser for the model's output (`ToolParserManager` names: hermes, llama3_json, glm45,
    mistral, qwen3_xml, ...); auto: by config.json's model_type (Qwen2/2.5/3 hermes, Llama-3.x llama3_json,
    GLM-4.x glm45; see `agentrl.rollout.tool_calls.PARSER_BY_TYPE`). Our tiny model's calls are Hermes-shaped."""
    stop_tokens: tuple[str, ...] = ()
    """Stop tokens beyond the tokenizer's eos and generation_config.json's eos_token_id (token strings; one the
    vocabulary lacks fails at load)."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra variables for the chat template, e.g. {enable_thinking: false} for Qwen3."""
    chat_template: str = ""
    """Replaces the model directory's chat template wherever prompts are rendered (rollout, evaluation,
    jobs.check_model) and in every published or exported directory. One of agentrl's tool-capable templates by
    name (`TEMPLATES_DIR`: chatml-tools, gemma-tools, phi3-tools), a template file (.jinja), or a model
    directory or tokenizer_config.json whose template to use. Empty: the directory's own. A template that lays
    out no tools fails at load, naming the template that fits the model's turns."""

    def validate(self, p: str) -> None:
        _check(bool(self.tool_parser.strip()), f"{p}.tool_parser", "must name a vLLM tool parser or be auto")
        if self.chat_template:
            try:
                chat_template_file(self.chat_template)
            except FileNotFoundError as e:
                raise ConfigError(f"{p}.chat_template: {e}") from None
        _check(self.rope_theta > 1, f"{p}.rope_theta", "must be > 1")
        _check(self.copy_init >= 0, f"{p}.copy_init", "must be >= 0 (0: off)")
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size", "max_position"):
            _check(getattr(self, name) > 0, f"{p}.{name}", "must be positive")
        _check(self.hidden_size % self.num_heads == 0, f"{p}.num_heads", "must divide hidden_size")
        _check(self.hidden_size // self.num_heads >= 64, f"{p}.num_heads",
               "head_dim (hidden_size/num_heads) must be >= 64 for vLLM's CPU attention")
        _check(self.vocab_size >= 300, f"{p}.vocab_size", "must be >= 300 (256 bytes + special tokens)")


TEMPLATES_DIR = Path(__file__).parent / "models" / "templates"
"""agentrl's own chat templates (`model.chat_template: NAME`), for families whose shipped template has no tools."""


def chat_template_names() -> list[str]:
    return sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))


def chat_template_file(spec: str) -> Path:
    """The file `model.chat_template` names: agentrl's template NAME, a template file, or a model directory's
    own template (its chat_template.jinja, else its tokenizer_config.json). FileNotFoundError says what is known."""
    builtin = TEMPLATES_DIR / f"{spec}.jinja"
    if "/" not in spec and builtin.exists():
        return builtin
    path = Path(spec).expanduser()
    if path.is_dir():
        for name in ("chat_template.jinja", "tokenizer_config.json"):
            if (path / name).exists():
                return path / name
        raise FileNotFoundError(f"{path} holds neither chat_template.jinja nor tokenizer_config.json")
    if path.is_file():
        return path
    raise FileNotFoundError(f"{spec!r} is neither one of agentrl's templates ({', '.join(chat_template_names())}) "
                            "nor a template file or model directory")


def chat_template_text(spec: str) -> str:
    """The template `model.chat_template` names, as text (a tokenizer_config.json's `chat_template`: the string,
    or of a list of named templates the `tool_use` one, else `default`)."""
    path = chat_template_file(spec)
    if path.suffix != ".json":
        return path.read_text()
    value = json.loads(path.read_text()).get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("tool_use") or named.get("default")
    if not isinstance(value, str) or not value:
        raise FileNotFoundError(f"{path} has no chat_template")
    return value


@dataclass(frozen=True)
class ControllerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port; the chosen address goes into rendezvous.json."""
    heartbeat_s: float = 1.0
    """How often workers heartbeat."""
    dead_after_s: float = 5.0
    """A worker with no heartbeat for this long is dead; its sessions end as env_error."""
    session_idle_s: float = 600.0
    """A session that hears nothing from its client (no call, no keep-alive) for this long is expired
    as env_error. The gateway client touches every session it holds each `keepalive_s`, so a session
    waiting for a slow generation or a weight sync lives as long as its rollout process does."""
    keepalive_s: float = 30.0
    """How often a gateway client (the rollout) touches the sessions it holds."""
    request_timeout_s: float = 30.0
    """How long the controller waits for a worker to answer one call (a hung worker costs this much)."""
    max_worker_failures: int = 3
    """Consecutive failed calls (timeouts, garbage answers) after which a worker is declared dead."""
    max_body_bytes: int = 4 * 1024 * 1024
    """Largest request body the controller and the workers accept (413 bad_request beyond)."""
    body_timeout_s: float = 10.0
    """How long the controller and the workers wait for a request's whole body (408 beyond): a client
    that announces more than it sends holds a socket this long, never a handler forever."""
    head_timeout_s: float = 10.0
    """A new connection to the controller or a worker must send a whole request head with the run's secret
    within this, or it is closed (`agentrl.envs.listener`: half-sent requests from anyone on the network)."""
    idle_timeout_s: float = 60.0
    """A keep-alive connection with no request for this long is closed (above the clients' own 15 s)."""
    max_pending_connections: int = 1024
    """Connections, of all peers together, that have not yet shown the run's secret: past it the oldest
    of the peer holding the most is closed to make room."""
    max_pending_per_peer: int = 256
    """The same, for one peer address: past it that peer's own oldest is closed."""
    max_connections: int = 0
    """All connections one server holds (0: half its file-descriptor limit, after raising it to the hard limit)."""

    def validate(self, p: str) -> None:
        _check(0 <= self.port < 65536, f"{p}.port", "must be in [0, 65535]")
        for name in ("heartbeat_s", "dead_after_s", "session_idle_s", "keepalive_s", "request_timeout_s",
                     "body_timeout_s", "head_timeout_s"):
            _check(getattr(self, name) > 0, f"{p}.{name}", "must be positive")
        _check(self.dead_after_s > self.heartbeat_s, f"{p}.dead_after_s", "must exceed heartbeat_s")
        _check(self.session_idle_s >= 2 * self.keepalive_s, f"{p}.session_idle_s",
               "must be at least 2 * keepalive_s (or a held session could expire between keep-alives)")
        _check(self.max_worker_failures >= 1, f"{p}.max_worker_failures", "must be >= 1")
        _check(self.max_body_bytes >= 64 * 1024, f"{p}.max_body_bytes", "must be >= 65536")
        _check(self.idle_timeout_s > 15.0, f"{p}.idle_timeout_s",
               "must exceed 15 (the clients keep idle connections 15 s; a server closing them first races them)")
        _check(self.max_pending_connections >= 1, f"{p}.max_pending_connections", "must be >= 1")
        _check(1 <= self.max_pending_per_peer <= self.max_pending_connections, f"{p}.max_pending_per_peer",
               "must be in [1, max_pending_connections]")
        _check(self.max_connections >= 0, f"{p}.max_connections", "must be >= 0 (0: from the descriptor limit)")


@dataclass(frozen=True)
class EnvsConfig:
    tasks: tuple[str, ...] = ("lookup",)
    """Task names served by the env workers (see agentrl.envs.tasks)."""
    workers: int = 1
    slots: int = 256
    """Concurrent sessions one worker accepts."""
    task_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Constructor options per task, e.g. `{os: {agentbench_dir: /path/AgentBench, sandbox: {backend: bwrap}},
    db: {backend: mariadb, mariadb_address: "db1:3306"}}`; each task's docstring lists its options."""
    max_argument_bytes: int = 8 * 1024
    """Tool-call arguments longer than this are refused with an error observation, never parsed."""
    max_output_chars: int = 16 * 1024
    """A tool result or other env message longer than this is cut, with a marker saying how much."""
    drain_s: float = 30.0
    """On SIGTERM a worker stops taking sessions and waits up to this long for its own to end."""
    max_tool_calls: int = 16
    """Tool calls in one assistant message beyond this: one error observation, none of them run."""
    message_budget_s: float = 18.0
    """Wall time for the work one assistant message asks for (all its calls, the grading of its answer): the
    agent's budget. Work cut at it is an observation; a message whose work cannot be stopped in time ends the
    episode as the agent's failure (docs/tasks.md). Capped at 3/4 of the worker's deadline for a call."""
    process_memory_mb: int = 1024
    """How much a session of a task that runs in its own process (`isolation: process`, the default) may grow
    that process; past it the message fails inside its own session (the agent's failure)."""
    expert_route: Literal["auto", "enabled", "disabled"] = "auto"
    """Whether workers answer /expert (the task's scripted expert hands out answers): auto | enabled |
    disabled (words YAML keeps as strings; `on`/`off` would turn into booleans).
    auto: on exactly when the run plays the expert (rollout.engine: expert, or a warm start with
    trainer.sft_steps > 0 and rollout.expert_samples > 0); see `agentrl.envs.serving.expert_route_on`."""

    def validate(self, p: str) -> None:
        _check(len(self.tasks) > 0, f"{p}.tasks", "must name at least one task")
        for name, options in self.task_options.items():
            _check(name in self.tasks, f"{p}.task_options.{name}", f"is not one of envs.tasks {list(self.tasks)}")
            _check(isinstance(options, dict), f"{p}.task_options.{name}", "must be a mapping of option: value")
        _check(self.workers >= 1, f"{p}.workers", "must be >= 1")
        _check(self.slots >= 1, f"{p}.slots", "must be >= 1")
        _check(self.max_argument_bytes >= 64, f"{p}.max_argument_bytes", "must be >= 64")
        _check(self.max_output_chars >= 256, f"{p}.max_output_chars", "must be >= 256")
        _check(self.drain_s >= 0, f"{p}.drain_s", "must be >= 0")
        _check(self.max_tool_calls >= 1, f"{p}.max_tool_calls", "must be >= 1")
        _check(self.message_budget_s > 0, f"{p}.message_budget_s", "must be > 0")
        _check(self.process_memory_mb >= 64, f"{p}.process_memory_mb", "must be >= 64")


@dataclass(frozen=True)
class RolloutConfig:
    engine: Literal["vllm", "expert"] = "vllm"
    """vllm | expert (the task's scripted expert, served by the env worker)."""
    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    """n: one GRPO group per prompt."""
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int = 0
    """Optional global cap on assistant turns per episode; 0: each task's own round limit alone (AgentBench-FC:
    os 8, db 15, kg 15, alfworld 20, webshop 20). Episodes the cap ends early are counted as `truncated` and
    get no failure penalty."""
    max_new_tokens: int = 48
    """Per assistant turn."""
    max_model_len: int = 512
    """Whole-conversation token limit; past it the episode ends as context_limit."""
    concurrency: int = 64
    """Agent loops running at once."""
    eval_split: str = "test"
    eval_samples: int = 64
    """Held-out samples evaluated (greedy) before and after RL."""
    eval_sampled: int = 0
    """Also sample each held-out sample this many times at `temperature` (the policy RL optimizes); 0: off."""
    expert_samples: int = 512
    """Train-split episodes of the scripted expert for the warm start."""
    kv_cache_gib: int = 1
    env_retries: int = 2
    """More attempts for an episode the infrastructure ended (env_error), each after a doubling pause."""
    env_wait_s: float = 120.0
    """How long an episode waits for a worker with room, and a step whose every episode failed in the env
    is collected again, before the rollout gives the run up (a dead worker is restarted meanwhile)."""
    env_latency_s: float = 0.0
    """Simulated env latency added by the rollout to every env call (start and each tool call): lognormal
    with this median; 0: off. For benchmarks of the pipeline against tool calls with a long tail."""
    env_latency_sigma: float = 0.99
    """σ of that lognormal: p99 = median · exp(2.326 σ), so 0.99 makes p99 about 10× the median."""
    template_check: Literal["strict", "warn", "off"] = "warn"
    """Each finished episode's tokens against one whole re-render of its conversation by the chat template
    (`agentrl.rollout.chat.Transcript.check`): strict raises, warn logs and counts them
    (`rollout/<task>/template_mismatch`), off skips the check."""

    def validate(self, p: str) -> None:
        _check(self.env_latency_s >= 0 and self.env_latency_sigma >= 0, f"{p}.env_latency_s",
               "env_latency_s and env_latency_sigma must be >= 0")
        _check(self.max_turns >= 0, f"{p}.max_turns", "must be >= 0 (0: each task's own limit)")
        for name in ("prompts_per_step", "samples_per_prompt", "max_new_tokens", "max_model_len",
                     "concurrency", "kv_cache_gib"):
            _check(getattr(self, name) >= 1, f"{p}.{name}", "must be >= 1")
        _check(self.env_retries >= 0, f"{p}.env_retries", "must be >= 0")
        _check(self.env_wait_s >= 0, f"{p}.env_wait_s", "must be >= 0")
        for name in ("eval_samples", "eval_sampled", "expert_samples"):
            _check(getattr(self, name) >= 0, f"{p}.{name}", "must be >= 0")
        _check(self.temperature >= 0, f"{p}.temperature", "must be >= 0")
        # vLLM reports log-probs after top-p renormalisation; the trainer does not re-apply the nucleus,
        # so with top_p < 1 every PPO ratio would be biased. Until it does, RL samples the full distribution.
        _check(self.top_p == 1.0, f"{p}.top_p", "must be 1.0 (the trainer's log-probs do not apply top-p yet)")
        _check(self.max_new_tokens < self.max_model_len, f"{p}.max_new_tokens", "must be < max_model_len")


@dataclass(frozen=True)
class TrainerConfig:
    steps: int = 20
    """RL steps (one optimizer step per batch)."""
    lr: float = 1e-4
    """RL learning rate. This default is tuned for the tiny model trained from scratch; a run from a pretrained
    `model.path` that sets none gets `PRETRAINED_DEFAULTS`' (1e-6, the paper's)."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch_tokens: int = 8192
    """Gradient accumulation: micro-batches of at most this many tokens."""
    sft_steps: int = 200
    """Warm-start optimizer steps on the scripted expert's trajectories (0: none)."""
    sft_lr: float = 3e-3
    """Warm-start learning rate; tuned for the tiny model from scratch, 1e-5 for a pretrained `model.path` that
    sets none (`PRETRAINED_DEFAULTS`)."""
    sft_batch: int = 32
    sft_warmup_steps: int = 10
    """Warm-start learning rate: linear warm-up over this many steps, then constant (0 or 1: constant from the
    first step). 10 suits the tiny model's long warm start; a few steps on a pretrained model want none."""
    sft_all_tokens: bool = False
    """Warm start on every token of the demonstrations (prompt and observations too), not only the
    actions. For a random-init model this doubles as pre-training on the task's text, which is what
    lets it learn to copy names and values out of its context; leave it off for a pretrained model."""
    sft_successful_only: bool = True
    """Warm start on the expert's successful episodes only (rejection sampling). false: imitate all of them,
    mistakes included (the demo's imperfect expert: RL then has to do better than its teacher)."""
    sft_target: float = 0.0
    """Stop the warm start before `sft_steps` once, for every task, this share of held-out successful
    demonstrations is reproducible (each action token at probability >= sft_min_token_prob); 0: run all
    `sft_steps`. Makes the warm start end after the copy skills form, wherever that lands on a machine."""
    sft_min_token_prob: float = 0.2
    sft_check_every: int = 50
    """Warm-start steps between two checks of `sft_target`."""
    sft_holdout: int = 32
    """Successful demonstrations per task held out of the warm start for `sft_target` (at most a quarter)."""
    update: Literal["rl", "sft"] = "rl"
    """What each of the `steps` does: rl (train on the rollout's batch) | sft (one more warm-start update on the
    expert's demonstrations instead: a control run, to tell RL's gain from more imitation)."""
    threads: int = 2
    seed: int = 0
    """Added to the run's `seed` for the trainer's own draws (warm-start batches, held-out demonstrations)."""
    warmup_steps: int = 0
    """RL learning rate: linear warm-up over this many steps, then constant."""
    packing: bool = True
    """Pack several trajectories per row (position ids restart per trajectory) instead of one padded
    trajectory per row; the padding fraction is logged as train/padding_frac either way."""
    parallel: Literal["none", "ddp", "fsdp2"] = "ddp"
    """Data parallelism over the trainer ranks (RANK/WORLD_SIZE or Slurm's variables): ddp | fsdp2
    (parameters, gradients and optimizer state sharded per decoder layer) | none (one rank only)."""
    mixed_precision: Literal["auto", "bf16", "fp32"] = "auto"
    """auto: bf16 compute on GPUs that support it, float32 elsewhere | bf16 | fp32."""
    attn_implementation: Literal["auto", "sdpa", "flex", "varlen"] = "auto"
    """Attention over packed rows (`agentrl.trainer.attention`): auto (varlen on CUDA in bf16, sdpa elsewhere) |
    sdpa (a materialised block-diagonal mask: the row's L² computed) | varlen (torch's varlen_attn: Σ sᵢ² over the
    trajectories; on a CPU an exact per-trajectory loop) | flex (flex_attention with a block mask; CUDA only)."""
    activation_checkpointing: bool = False
    """Keep only each decoder layer's input for the backward pass and recompute the rest (Hugging Face's
    gradient checkpointing, non-reentrant): activation memory falls from every layer's to about one layer's,
    for about one more forward pass per step. The same update either way."""
    freeze_layers: int = 0
    """The token embedding (and an output head tied to it) and the first this many decoder layers are not trained:
    the backward pass stops above them, for a step that costs a fraction of a full one on a small machine
    (warm start and RL alike). 0: every parameter is trained."""
    checkpoint_every: int = 10
    """Write ckpt/step-<N> every this many RL steps (and after the last); 0: never."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept; older ones are deleted once a newer one is complete."""

    def validate(self, p: str) -> None:
        _check(self.steps >= 0, f"{p}.steps", "must be >= 0")
        _check(self.sft_steps >= 0, f"{p}.sft_steps", "must be >= 0")
        for name in ("lr", "sft_lr", "micro_batch_tokens", "sft_batch", "threads"):
            _check(getattr(self, name) > 0, f"{p}.{name}", "must be positive")
        _check(self.grad_clip >= 0, f"{p}.grad_clip", "must be >= 0 (0 disables clipping)")
        _check(0 <= self.sft_target <= 1, f"{p}.sft_target", "must be in [0, 1] (0: off)")
        _check(0 < self.sft_min_token_prob < 1, f"{p}.sft_min_token_prob", "must be in (0, 1)")
        _check(self.sft_check_every >= 1, f"{p}.sft_check_every", "must be >= 1")
        _check(self.sft_holdout >= 1, f"{p}.sft_holdout", "must be >= 1")
        _check(self.warmup_steps >= 0, f"{p}.warmup_steps", "must be >= 0")
        _check(self.freeze_layers >= 0, f"{p}.freeze_layers", "must be >= 0 (0: train every layer)")
        _check(self.sft_warmup_steps >= 0, f"{p}.sft_warmup_steps", "must be >= 0")
        _check(self.checkpoint_every >= 0, f"{p}.checkpoint_every", "must be >= 0 (0: never)")
        _check(self.keep_checkpoints >= 1, f"{p}.keep_checkpoints", "must be >= 1")


@dataclass(frozen=True)
class AlgoConfig:
    adv_estimator: Literal["grpo", "rloo", "reinforce_pp"] = "grpo"
    task_norm: bool = True
    """Per-task normalization of action-token advantages (AgentRL eq. 1)."""
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float = 3.0
    """Dual-clip bound c > 1 for negative advantages; 0 disables it."""
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    entropy_coef: float = 0.0
    fail_penalty: float = -0.2
    """Reward for agent failures (invalid_action, turn_limit, context_limit)."""
    max_staleness: int = 0
    offpolicy: Literal["behaviour", "decoupled", "tis"] = "behaviour"
    """The policy-gradient loss: behaviour (PPO ratio against the engine's log-probs), decoupled (AReaL's
    decoupled PPO: clip against the trainer's pre-step policy, weight by π_prox/μ) or tis (the same
    arithmetic, truncated at is_cap, named for engine–trainer mismatch)."""
    is_weight: Literal["truncate", "mask", "seq_truncate", "none"] = "truncate"
    """decoupled only: the behaviour weight (truncate | mask | seq_truncate | none)."""
    is_cap: float = 2.0
    """Upper bound C of the behaviour weight (decoupled, tis)."""
    drop_uniform_groups: bool = True
    """Leave out groups whose rewards are all equal (no GRPO signal) before task normalization."""
    eps: float = 1e-6

    def validate(self, p: str) -> None:
        _check(0 <= self.eps_low < 1, f"{p}.eps_low", "must be in [0, 1)")
        _check(self.eps_high >= 0, f"{p}.eps_high", "must be >= 0")
        _check(self.dual_clip == 0 or self.dual_clip > 1, f"{p}.dual_clip", "must be 0 (off) or > 1")
        _check(self.kl_coef >= 0, f"{p}.kl_coef", "must be >= 0")
        _check(self.max_staleness >= 0, f"{p}.max_staleness", "must be >= 0")
        _check(self.is_cap > 0, f"{p}.is_cap", "must be > 0")


@dataclass(frozen=True)
class TransportConfig:
    poll_s: float = 0.05
    weights: Literal["dir", "broadcast"] = "dir"
    """Asynchronous schedule: how engines get new weights. dir: versioned safetensors directories (also
    what restarts read); broadcast: the in-job gloo/NCCL broadcast, with the directory still written."""
    min_groups: int = 0
    """Asynchronous schedule: complete GRPO groups a step waits for; 0: one synchronous step's worth
    (prompts_per_step × tasks)."""
    max_groups: int = 0
    """The most complete groups one step takes (the dynamic batch); 0: min_groups."""
    group_timeout_s: float = 600.0
    """A group still missing members this long after its first arrived is dropped (counted group_timeout)."""
    queue_capacity: int = 0
    """Trajectories in complete groups at which the trainer's queue stops receiving (back-pressure); 0:
    4 × max_groups × group size. At least min_groups × group size, so that a full queue can release a batch."""
    channel: Literal["mpi", "files"] = "mpi"
    """Asynchronous schedule: how trajectories and notices travel. mpi: one MPI world (mpiexec, or srun
    across het groups); files: no MPI, the shard segments and a notice file in the run dir, polled every
    `poll_s`, for roles that run as separate jobs (each rollout rank restarts alone; weights must be dir)."""
    inflight: Literal["swap", "abort", "drain"] = "swap"
    """New weights while episodes are mid-trajectory. swap: between generation calls (each token keeps
    the version that sampled it); abort: cancel the running episodes and start them again on the new
    weights; drain: stop starting episodes until the running ones finish, then swap (no mixed versions)."""

    def validate(self, p: str) -> None:
        _check(self.poll_s > 0, f"{p}.poll_s", "must be positive")
        _check(self.channel != "files" or self.weights == "dir", f"{p}.channel",
               "files needs transport.weights=dir (the broadcast is one group of every rank: a rank restarted "
               "alone cannot rejoin it)")
        _check(self.min_groups >= 0 and self.max_groups >= 0 and self.queue_capacity >= 0, f"{p}.min_groups",
               "min_groups, max_groups and queue_capacity must be >= 0")
        _check(self.max_groups == 0 or self.max_groups >= self.min_groups, f"{p}.max_groups",
               "must be 0 or >= min_groups")
        _check(self.group_timeout_s > 0, f"{p}.group_timeout_s", "must be positive")


@dataclass(frozen=True)
class MonitorConfig:
    tensorboard: bool = True
    controller_stats_s: float = 30.0
    """Seconds between the controller's own `env/*` statistics in TensorBoard (0: none)."""

    def validate(self, p: str) -> None:
        if self.controller_stats_s < 0:
            raise ConfigError(f"{p}.controller_stats_s must be >= 0")


_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{2}){0,2}$")
_SLURM_MEM = re.compile(r"^\d+[KMGT]?$")


def slurm_seconds(time: str) -> int:
    """Slurm's time format in seconds: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`."""
    days, _, rest = time.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # after a day count the first field is hours
        h, m, sec = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        h, m, sec = parts
    else:  # MM or MM:SS
        h, m, sec = 0, parts[0], (parts[1] if len(parts) > 1 else 0)
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


@dataclass(frozen=True)
class SlurmGroupConfig:
    """Where one het group (or, with `cluster.hetjob: false`, one role's job) is queued. Empty strings
    leave the site's default (no `#SBATCH` line is rendered for them)."""
    partition: str = ""
    account: str = ""
    qos: str = ""
    time: str = "01:00:00"
    """Wall-clock limit, Slurm's format (`MM`, `HH:MM:SS`, `D-HH:MM:SS`)."""
    cpus_per_task: int = 2
    mem: str = ""
    """Memory per node (`--mem`), Slurm's format (`64G`; `0`: all of each node's memory, for nodes the job
    has to itself); "" leaves the site default. Every step of the group then runs with `--mem=0` (the job's
    memory on its nodes, without taking it from the group's other steps)."""
    mem_per_gpu: str = ""
    """Memory per allocated GPU (`--mem-per-gpu`, e.g. `120G`), instead of `mem`; only for groups with GPUs."""
    constraint: str = ""

    def validate(self, p: str) -> None:
        _check(bool(_SLURM_TIME.match(self.time)), f"{p}.time", f"{self.time!r} is not a Slurm time (D-HH:MM:SS)")
        _check(self.cpus_per_task >= 1, f"{p}.cpus_per_task", "must be >= 1")
        for name in ("mem", "mem_per_gpu"):
            value = getattr(self, name)
            _check(value == "" or bool(_SLURM_MEM.match(value)), f"{p}.{name}",
                   f"{value!r} is not a Slurm memory size (e.g. 64G)")
        _check(not (self.mem and self.mem_per_gpu), f"{p}.mem_per_gpu",
               "set mem or mem_per_gpu, not both (Slurm refuses --mem with --mem-per-gpu)")
        for name in ("partition", "account", "qos", "constraint"):
            _check(not any(c.isspace() for c in getattr(self, name)), f"{p}.{name}", "must not contain spaces")


@dataclass(frozen=True)
class TrainerTopology:
    """The trainer het group: one rank per GPU (or `ranks_per_node` CPU ranks where gpus_per_node is 0)."""
    nodes: int = 1
    gpus_per_node: int = 0
    ranks_per_node: int = 1
    """CPU ranks per node; on GPU nodes it must equal gpus_per_node (one rank per GPU)."""
    collective_timeout_s: float = 0.0
    """torch.distributed's collective timeout for the trainer's process group: a rank stuck in a collective
    (a peer died, a hung NCCL call) fails after this long instead of holding the job until its time limit.
    0: 30 minutes, or half the group's `slurm.time` where that is shorter; a set value must be shorter than
    `slurm.time`; the rendered scripts also set TORCH_NCCL_ASYNC_ERROR_HANDLING=1
    on GPU trainer steps, so a timed-out NCCL collective ends the process (and srun the step)."""
    slurm: SlurmGroupConfig = field(default_factory=SlurmGroupConfig)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def collective_timeout(self) -> float:
        """`collective_timeout_s`, with 0 resolved (seconds)."""
        return self.collective_timeout_s or min(1800.0, slurm_seconds(self.slurm.time) / 2)

    def validate(self, p: str) -> None:
        _check(self.nodes >= 1, f"{p}.nodes", "must be >= 1")
        _check(self.gpus_per_node >= 0, f"{p}.gpus_per_node", "must be >= 0")
        _check(self.ranks_per_node >= 1, f"{p}.ranks_per_node", "must be >= 1")
        _check(self.gpus_per_node == 0 or self.ranks_per_node == self.gpus_per_node, f"{p}.ranks_per_node",
               f"must equal gpus_per_node ({self.gpus_per_node}): one trainer rank per GPU")
        self.slurm.validate(f"{p}.slurm")
        _check(self.slurm.mem_per_gpu == "" or self.gpus_per_node > 0, f"{p}.slurm.mem_per_gpu",
               "needs gpus_per_node > 0 (no GPUs to count memory by)")
        limit = slurm_seconds(self.slurm.time)
        _check(0 <= self.collective_timeout_s < limit, f"{p}.collective_timeout_s",
               f"must be >= 0 (0: auto) and shorter than {p}.slurm.time ({self.slurm.time} = {limit} s)")


@dataclass(frozen=True)
class RolloutTopology:
    """The rollout het group: `ranks` processes, each driving its own vLLM engines: `engines_per_rank` current
    ones (each episode's turns on one of them, `agentrl.rollout.engine_pool`) plus `lagging_engines_per_rank`
    lagging ones (cross-policy sampling). The engine settings (dtype, tensor_parallel_size,
    gpu_memory_utilization, enforce_eager, max_num_seqs, kv_cache_memory_gib) reach every engine
    (`agentrl.rollout.from_config`). With gpus_per_node 0 (CPU) the engines run in the rank's process, float32
    and eager, as before; on GPU nodes each engine runs in its own process on its own tensor_parallel_size GPUs
    of the rank's (`agentrl.rollout.placement`; docs/slurm.md, GPU placement)."""
    nodes: int = 1
    ranks: int = 1
    engines_per_rank: int = 1
    """Engines of the current pool (always the newest weights) per rank; a rank spreads its episodes over them
    (each episode on the least busy one at its first turn). Engine ids: current engine j of rank r is
    r * engines_per_rank + j (with one per rank: the rank)."""
    lagging_engines_per_rank: int = 0
    """Engines of the lagging pool per rank (cross-policy sampling, docs/architecture.md §5); 0: none. Engine ids:
    lagging engine k of rank r is 1000 + r * lagging_engines_per_rank + k."""
    lagging_prob: float = 0.0
    """Probability that a turn (one generation call) is generated by the lagging pool; > 0 needs
    lagging_engines_per_rank >= 1. The paper uses 0.25."""
    lagging_refresh_steps: int = 25
    """K: a lagging engine loads the newest weights once the current engine is K or more versions ahead of
    it, so it samples at most K - 1 versions behind; its tokens are trained on up to algo.max_staleness + K
    versions old (docs/pipeline.md, cross-policy sampling)."""
    gpus_per_node: int = 0
    gpu_memory_utilization: float = 0.85
    """vLLM's `gpu_memory_utilization`: the share of each of an engine's GPUs it may take (weights + KV cache);
    no other engine of the rank uses them."""
    tensor_parallel_size: int = 1
    """GPUs per engine: engine k of a rank (current ones first, then lagging) takes the rank's GPUs
    [k * tensor_parallel_size, (k + 1) * tensor_parallel_size), in CUDA_VISIBLE_DEVICES order."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """vLLM's dtype (auto: the checkpoint's). On CPU (gpus_per_node 0) auto means float32, as before."""
    enforce_eager: bool = True
    """vLLM's enforce_eager: true runs eager PyTorch; false captures CUDA graphs (faster decoding on GPUs,
    more start-up time and memory). CPU engines always run eager."""
    max_num_seqs: int = 0
    """Sequences one engine batches at once (vLLM's max_num_seqs); 0: rollout.concurrency."""
    kv_cache_memory_gib: float = 0.0
    """GPU engines: KV-cache size per engine in GiB (vLLM's kv_cache_memory_bytes), instead of what
    gpu_memory_utilization leaves after the weights; 0: that remainder. CPU engines use rollout.kv_cache_gib."""
    linger_ms: float = 5.0
    """CPU engines (in the rank's process): after a step that finished requests, at most how long the engine
    waits for their agent loops to ask for their next turns (or go to the env) before it steps again, so a next
    turn joins the very next step instead of the one after (`VLLMEngine(linger_s=)`); 0: step at once. The wait
    ends as soon as the loops have reacted. On 2 cores 5 ms raised our loop from 0.82 to 0.86 of the
    same-structure replay, higher in each of 3 pairs (`jobs.bench_agent_loop --linger-ms 0,5`; docs/pipeline.md
    §7). Engines of their own process (GPU nodes) do not linger: measured on such an engine (on CPU) it gained
    nothing (0 to -4 % in 3 pairs), since their EngineCore steps on its own while our thread waits."""
    slurm: SlurmGroupConfig = field(default_factory=SlurmGroupConfig)

    @property
    def gpus_per_rank(self) -> int:
        return (self.engines_per_rank + self.lagging_engines_per_rank) * self.tensor_parallel_size

    def engine_settings(self, concurrency: int) -> dict[str, Any]:
        """Keyword arguments of each of a rank's vLLM engines (`agentrl.rollout.engine.VLLMEngine`), beside the
        GPUs it runs on (`agentrl.rollout.from_config.rank_devices`).

        CPU (gpus_per_node 0): float32 unless a dtype is set, always eager, no GPU memory settings, `linger_ms`.
        GPU: the configured dtype, tensor parallel size and eager/CUDA-graph choice, and the whole
        gpu_memory_utilization: every engine runs in its own process on GPUs of its own."""
        seqs = self.max_num_seqs or concurrency
        if not self.gpus_per_node:
            return {"dtype": "float32" if self.dtype == "auto" else self.dtype, "max_num_seqs": seqs,
                    "linger_s": self.linger_ms / 1e3}
        kv = int(self.kv_cache_memory_gib * (1 << 30)) or None
        return {"dtype": self.dtype, "max_num_seqs": seqs, "enforce_eager": self.enforce_eager,
                "tensor_parallel_size": self.tensor_parallel_size,
                "gpu_memory_utilization": self.gpu_memory_utilization, "kv_cache_memory_bytes": kv}

    def validate(self, p: str) -> None:
        for name in ("nodes", "ranks", "engines_per_rank", "tensor_parallel_size", "lagging_refresh_steps"):
            _check(getattr(self, name) >= 1, f"{p}.{name}", "must be >= 1")
        _check(self.lagging_engines_per_rank >= 0, f"{p}.lagging_engines_per_rank", "must be >= 0")
        _check(0.0 <= self.lagging_prob <= 1.0, f"{p}.lagging_prob", "must be in [0, 1]")
        _check(self.lagging_prob == 0.0 or self.lagging_engines_per_rank >= 1, f"{p}.lagging_prob",
               f"is {self.lagging_prob} but lagging_engines_per_rank is 0: no lagging engine to route turns to")
        # engine ids (agentrl.types): current < 1000 <= lagging <= 32767 (the shards' int16 engine array)
        _check(self.ranks * self.engines_per_rank <= 1000, f"{p}.ranks",
               "ranks x engines_per_rank must be <= 1000 (current engine ids stay below the lagging ones)")
        _check(1000 + self.ranks * self.lagging_engines_per_rank <= 32768, f"{p}.lagging_engines_per_rank",
               "ranks x lagging_engines_per_rank must be <= 31768 (engine ids are int16)")
        _check(self.ranks % self.nodes == 0, f"{p}.ranks", f"must be a multiple of nodes ({self.nodes})")
        _check(0.0 < self.gpu_memory_utilization <= 1.0, f"{p}.gpu_memory_utilization", "must be in (0, 1]")
        _check(self.max_num_seqs >= 0, f"{p}.max_num_seqs", "must be >= 0 (0: rollout.concurrency)")
        _check(self.kv_cache_memory_gib >= 0, f"{p}.kv_cache_memory_gib", "must be >= 0 (0: off)")
        _check(0 <= self.linger_ms <= 1000, f"{p}.linger_ms", "must be in [0, 1000] (0: off)")
        _check(self.gpus_per_node >= 0, f"{p}.gpus_per_node", "must be >= 0")
        if self.gpus_per_node:  # every engine gets its own GPUs: the node must hold exactly the ranks' engines
            per_rank, rem = divmod(self.gpus_per_node, self.ranks // self.nodes)
            _check(rem == 0, f"{p}.gpus_per_node",
                   f"must be a multiple of the ranks per node ({self.ranks // self.nodes})")
            _check(self.gpus_per_rank <= per_rank, f"{p}.tensor_parallel_size",
                   f"(engines_per_rank {self.engines_per_rank} + lagging_engines_per_rank "
                   f"{self.lagging_engines_per_rank}) x tensor_parallel_size {self.tensor_parallel_size} = "
                   f"{self.gpus_per_rank} GPUs per rollout rank, but a rank has gpus_per_node / (ranks / nodes) = "
                   f"{per_rank}")
            need = self.ranks // self.nodes * self.gpus_per_rank
            _check(self.gpus_per_node == need, f"{p}.gpus_per_node",
                   f"must equal ranks per node x (engines_per_rank + lagging_engines_per_rank) x "
                   f"tensor_parallel_size = {need} (no GPU of a rollout node left idle)")
        _check(self.slurm.mem_per_gpu == "" or self.gpus_per_node > 0, f"{p}.slurm.mem_per_gpu",
               "needs gpus_per_node > 0 (no GPUs to count memory by)")
        self.slurm.validate(f"{p}.slurm")


@dataclass(frozen=True)
class EnvTopology:
    """The env het group: the controller (by default) and `envs.workers` env workers over `nodes` nodes."""
    nodes: int = 1
    apptainer_image: str = ""
    """The env workers' image (built from containers/agentrl.def); "" runs them on the node's Python."""
    binds: tuple[str, ...] = ()
    """Extra host paths bound into the workers' containers (the run dir and data dir always are)."""
    os_sandbox_image: str = ""
    """The `os` task's per-session sandbox image (built from containers/os-sandbox.def); the launcher
    writes it into envs.task_options.os.sandbox (backend apptainer). "" leaves the task's own options."""
    slurm: SlurmGroupConfig = field(default_factory=SlurmGroupConfig)

    def validate(self, p: str) -> None:
        _check(self.nodes >= 1, f"{p}.nodes", "must be >= 1")
        self.slurm.validate(f"{p}.slurm")


@dataclass(frozen=True)
class ClusterConfig:
    launcher: Literal["local", "slurm"] = "local"
    """local: roles as processes on this machine | slurm: one Slurm job through submitit (jobs.launch)."""
    role_timeout_s: float = 3600.0
    """The local launcher stops the run if a role has not finished by then."""
    max_restarts: int = 3
    """Times a dead env worker is started again (per worker) before it counts as failed: by the local launcher
    (which also restarts the asynchronous MPI world as often) and by the rendered Slurm scripts (each worker
    its own srun step; past the bound that worker stays down and the run goes on with the others; the
    asynchronous MPMD step is started again as often, after its rendezvous keys are cleared)."""
    schedule: Literal["sync", "async"] = "async"
    """async (the default): the trainer and `cluster.rollout.ranks` rollout ranks in one MPI world (mpiexec),
    trajectories over MPI, in-flight weight updates (docs/pipeline.md); with transport.channel=files, separate
    processes without MPI. sync: the baseline the benchmarks compare against, the same pipeline with its
    numbers fixed (`RunConfig.pipeline`: max_staleness 0 and inflight drain whatever `algo` and `transport`
    say, one step's groups per step, one rollout rank): rollout and trainer take turns."""
    engine_threads: int = 2
    """OMP_NUM_THREADS of each rollout rank under mpiexec (which would otherwise start it with 1, and
    vLLM's CPU attention then aborts)."""
    hetjob: bool = True
    """One heterogeneous job (trainer, rollout, env groups); false: one job per role, chained with
    dependencies, for sites that forbid hetjobs (needs transport.channel=files)."""
    controller_placement: Literal["env", "trainer"] = "env"
    """The het group whose first node runs the controller: env | trainer."""
    signal_s: int = 300
    """Seconds before the time limit at which Slurm sends USR1 (checkpoint, then requeue)."""
    python: str = ".venv/bin/python"
    """The Python the jobs run: a path (a relative one is resolved against the repository root when the script
    is rendered) or a bare name found on PATH after `setup` (e.g. `python3`)."""
    mpi: Literal["pmi2", "pmix", "none"] = "pmi2"
    """srun's MPI plugin (`--mpi=`) for the steps that are MPI programs (the asynchronous schedule's trainer +
    rollout step). pmi2 suits the MPICH wheel; pmix an MPI built with PMIx (OpenMPI); none for an MPI that
    starts itself. Steps that run no MPI (controller, env workers, the synchronous roles, the model build)
    always get `--mpi=none`, so a site without PMI2 can run them."""
    gpu_binding: Literal["gpus-per-task", "gres"] = "gpus-per-task"
    """How GPU groups ask for GPUs and bind them to tasks. gpus-per-task: `#SBATCH --gpus-per-node=N`, and each
    trainer task gets `--gpus-per-task=1 --gpu-bind=per_task:1`, each rollout task its engines' GPUs, so
    every task sees only its own (select/cons_tres, Slurm >= 21.08). gres: `#SBATCH --gres=gpu:N` and steps
    `--gres=gpu:<per node>`, for sites that account GPUs as GRES only: trainer tasks see their node's GPUs
    and take cuda:LOCAL_RANK (NCCL's peer-to-peer paths stay visible), rollout tasks are bound with
    `--gpu-bind=mask_gpu:...` to disjoint GPUs."""
    setup: tuple[str, ...] = ()
    """Shell lines the job runs before anything else and before every step's program on its node (module loads,
    `source /path/venv/bin/activate`, exports), e.g. `[module load cuda/12.4, module load apptainer]`."""
    trainer: TrainerTopology = field(default_factory=TrainerTopology)
    rollout: RolloutTopology = field(default_factory=RolloutTopology)
    env: EnvTopology = field(default_factory=EnvTopology)

    def validate(self, p: str) -> None:
        for i, line in enumerate(self.setup):
            _check("\n" not in line and line.strip() != "", f"{p}.setup[{i}]", "must be one non-empty shell line")
        _check(self.engine_threads >= 1, f"{p}.engine_threads", "must be >= 1")
        _check(self.role_timeout_s > 0, f"{p}.role_timeout_s", "must be positive")
        _check(self.max_restarts >= 0, f"{p}.max_restarts", "must be >= 0")
        _check(self.signal_s >= 0, f"{p}.signal_s", "must be >= 0")
        _check(bool(self.python), f"{p}.python", "must name a Python")
        self.trainer.validate(f"{p}.trainer")
        self.rollout.validate(f"{p}.rollout")
        self.env.validate(f"{p}.env")
        if self.schedule == "sync":
            # The baseline takes turns: one rank samples a step's groups while the trainer waits for all of them.
            _check(self.rollout.ranks == 1, f"{p}.rollout.ranks",
                   f"the synchronous schedule runs one rollout rank, not {self.rollout.ranks}; "
                   "use cluster.schedule=async (the default) for more")


@dataclass(frozen=True)
class PipelineShape:
    """The pipeline's derived numbers, worked out in one place (`RunConfig.pipeline`) from `rollout`, `algo`,
    `transport` and `cluster`: what the trainer's queue, its steps and each rollout rank's admission use.

    The synchronous schedule is this pipeline with `max_staleness` 0, `inflight` drain and exactly one step's
    groups per step: the rollout rank starts a step's groups on v<N>, the trainer takes all of them, trains
    once and publishes v<N+1>, and only then does the next step's sampling start."""

    group_size: int
    min_groups: int
    """Complete groups a step waits for (transport.min_groups; 0 there: one step's worth)."""
    max_groups: int
    capacity: int
    """Trajectories the trainer's queue holds before it stops receiving."""
    max_staleness: int
    lagging_max_staleness: int
    """How old a lagging-pool token may be when trained on. A lagging engine reloads once the current engine is
    K = lagging_refresh_steps versions ahead, so it samples at most K - 1 versions behind; the trainer may then
    be up to max_staleness versions further on (one version of slack)."""
    inflight: str
    group_timeout_s: float
    steps: int


@dataclass(frozen=True)
class RunConfig:
    name: str = "demo"
    run_root: str = "runs"
    seed: int = 0
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    envs: EnvsConfig = field(default_factory=EnvsConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run_root) / self.name

    @property
    def pipeline(self) -> PipelineShape:
        """The pipeline's derived numbers (see `PipelineShape`); the synchronous schedule's are fixed."""
        r, t, a, pool = self.rollout, self.transport, self.algo, self.cluster.rollout
        step_groups = r.prompts_per_step * len(self.envs.tasks)
        sync = self.cluster.schedule == "sync"
        min_groups = step_groups if sync else t.min_groups or step_groups
        max_groups = min_groups if sync else t.max_groups or min_groups
        staleness = 0 if sync else a.max_staleness
        return PipelineShape(
            group_size=r.samples_per_prompt, min_groups=min_groups, max_groups=max_groups,
            capacity=t.queue_capacity or 4 * max_groups * r.samples_per_prompt, max_staleness=staleness,
            lagging_max_staleness=staleness + (pool.lagging_refresh_steps if pool.lagging_engines_per_rank else 0),
            inflight="drain" if sync else t.inflight, group_timeout_s=t.group_timeout_s, steps=self.trainer.steps)

    def validate(self, p: str = "") -> None:
        _check(bool(self.name) and "/" not in self.name and self.name not in (".", ".."), "name",
               "must be a non-empty name without '/'")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if dataclasses.is_dataclass(v):
                v.validate(f.name)
        # fields that only make sense together
        _check(self.trainer.sft_steps == 0 or self.rollout.expert_samples > 0, "rollout.expert_samples",
               "must be > 0 when trainer.sft_steps > 0 (the warm start trains on the expert's episodes)")
        _check(self.trainer.update == "rl" or self.trainer.sft_steps > 0, "trainer.update",
               "sft (the control run) continues the warm start: it needs trainer.sft_steps > 0")
        _check(self.trainer.steps == 0 or self.rollout.samples_per_prompt >= 2, "rollout.samples_per_prompt",
               "must be >= 2 for RL: group advantages of a group of one are 0")
        _check(self.envs.workers >= self.cluster.env.nodes, "envs.workers",
               f"must be >= cluster.env.nodes ({self.cluster.env.nodes}): every env node runs a worker")
        _check(bool(self.model.path) or self.rollout.max_model_len <= self.model.max_position,
               "rollout.max_model_len", "must be <= model.max_position")
        # the baseline's numbers are fixed (`RunConfig.pipeline`: max_staleness 0 and drain whatever algo and transport
        # say, so that `cluster.schedule=sync` on any preset is its baseline); a batch size of its own contradicts it
        if self.cluster.schedule == "sync":
            _check(self.transport.min_groups == 0 and self.transport.max_groups == 0, "transport.min_groups",
                   "min_groups and max_groups must be 0 with cluster.schedule=sync (each step takes one step's "
                   "groups: rollout.prompts_per_step x tasks)")
        shape = self.pipeline
        _check(shape.capacity >= shape.min_groups * shape.group_size, "transport.queue_capacity",
               f"must be 0 or >= min_groups x rollout.samples_per_prompt ({shape.min_groups * shape.group_size}): "
               "a full queue must hold a batch, or the trainer stops receiving with none to take")
        # Trainer and rollout ranks start, stop and requeue together: one MPMD srun step across het groups (MPI
        # channel), or steps of the same job (file channel). Jobs of their own (cluster.hetjob=false) need the
        # file channel, whose rollout ranks follow a requeued trainer by starting again.
        _check(self.cluster.hetjob or self.transport.channel == "files", "cluster.hetjob",
               "false (one job per role) needs transport.channel=files: an MPI world cannot span separate jobs")
        trainer_ranks = self.cluster.trainer.world_size
        if trainer_ranks > 1:
            # Data-parallel trainer ranks meet through the MPMD world (ranks and rendezvous from MPI), or with the
            # file channel as one srun step of T tasks (ranks from Slurm through `launch.slurm_env`); the local
            # launcher starts one file-channel trainer process (jobs.train says so).
            _check(self.trainer.parallel != "none", "trainer.parallel",
                   f"must be ddp or fsdp2 with {trainer_ranks} trainer ranks (cluster.trainer nodes x ranks_per_node)")


# ---------------------------------------------------------------------------------------------- building

def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check `value` against annotation `tp` (int, float, str, bool, Literal[...], tuple[X, ...], dict[K, V], Any,
    dataclass)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        _check(isinstance(value, dict), path, f"expected a mapping, got {type(value).__name__}")
        return _build(tp, value, path)
    if tp is Any:
        return value.parsed if isinstance(value, Scalar) else value
    if origin is dict:
        _check(isinstance(value, dict), path, f"expected a mapping, got {value!r}")
        key_tp, value_tp = typing.get_args(tp)
        return {_coerce(k, key_tp, path): _coerce(v, value_tp, f"{path}.{k}") for k, v in value.items()}
    if origin is tuple:
        _check(isinstance(value, (list, tuple)), path, f"expected a list, got {value!r}")
        (item,) = {a for a in typing.get_args(tp) if a is not Ellipsis}
        return tuple(_coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is Literal:  # a choice: one of the listed values, as YAML or the command line gave it
        choices = typing.get_args(tp)
        if isinstance(value, Scalar):
            value = str(value) if str(value) in choices else value.parsed
        _check(value in choices and type(value) in {type(c) for c in choices}, path,
               f"unknown value {value!r} ({' | '.join(str(c) for c in choices)})")
        return value
    if isinstance(value, Scalar):  # a command-line value: the text for strings, the number for numbers
        value = str(value) if tp is str else value.parsed
    if tp is bool:
        _check(isinstance(value, bool), path, f"expected true/false, got {value!r}")
        return value
    if tp is int:
        _check(isinstance(value, int) and not isinstance(value, bool), path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _looks_numeric(value) and value.strip() == value:
            value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
        _check(isinstance(value, (int, float)) and not isinstance(value, bool), path,
               f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        _check(isinstance(value, str), path, f"expected a string, got {value!r}")
        return str(value)
    if isinstance(tp, types.UnionType):  # pragma: no cover - no unions in the tree yet
        raise ConfigError(f"{path}: unions are not supported")
    raise ConfigError(f"{path}: unsupported type {tp}")


def _build(cls: type, data: dict[str, Any], path: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        where = f"{path}.{key}" if path else key
        _check(key in names, where, f"unknown field (known: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(v, hints[k], f"{path}.{k}" if path else k) for k, v in data.items()}
    return cls(**kwargs)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        _check(isinstance(node, dict), dotted, "is not a section")
    node[keys[-1]] = value


class Scalar(str):
    """A command-line value as typed, with what YAML reads it as (`parsed`): a string field gets the text
    ("3.10" stays "3.10"), a number field gets the number ("1e-5", which YAML 1.1 leaves a string, too)."""

    parsed: Any

    def __new__(cls, text: str, parsed: Any) -> Scalar:
        obj = super().__new__(cls, text)
        obj.parsed = parsed
        return obj


def parse_override(text: str) -> tuple[str, Any]:
    """`trainer.lr=1e-5` → ("trainer.lr", 1e-5); the value is read as a YAML scalar or list, and a scalar
    that reads as a number keeps its text for string fields (see `Scalar`)."""
    if "=" not in text:
        raise ConfigError(f"{text}: override must look like section.field=value")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("-")
    value = yaml.safe_load(raw) if raw.strip() else ""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number or isinstance(value, str) and _looks_numeric(value):
        value = Scalar(raw.strip(), value)
    return key, value


def _looks_numeric(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


# Where the model comes from decides the scale of its learning rates. The dataclass defaults train our tiny
# model from scratch (a warm start at 3e-3); the same rates destroy a pretrained model within a few steps.
PRETRAINED_DEFAULTS: dict[str, Any] = {"trainer.lr": 1e-6, "trainer.sft_lr": 1e-5}
"""What a run from a pretrained `model.path` gets for the fields neither its preset nor its overrides set."""
SCRATCH_TUNED = ("trainer.lr", "trainer.sft_lr", "trainer.sft_all_tokens")
"""Fields a preset for the tiny model tunes to its scale: with another `model.path` they must be set again."""


def _get_dotted(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for k in dotted.split("."):
        if not isinstance(node, dict) or k not in node:
            return None
        node = node[k]
    return node


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """The config of `data` (a preset's tree with overrides). A pretrained `model.path` gets
    `PRETRAINED_DEFAULTS` for the fields `data` does not set."""
    if _get_dotted(data, "model.path"):
        data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
        for key, value in PRETRAINED_DEFAULTS.items():
            if _get_dotted(data, key) is None:
                _set_dotted(data, key, value)
    cfg = _build(RunConfig, data, "")
    cfg.validate()
    return cfg


def _check_source(preset: str, preset_data: dict[str, Any], overrides: dict[str, Any]) -> None:
    """A preset written for the tiny model (no model.path) run with a pretrained `model.path`: the fields it tunes
    to the tiny model's scale (`SCRATCH_TUNED`) must come from the command line too, not silently from it."""
    if _get_dotted(preset_data, "model.path") or not overrides.get("model.path"):
        return
    tuned = [k for k in SCRATCH_TUNED if _get_dotted(preset_data, k) is not None and k not in overrides]
    _check(not tuned, ", ".join(tuned),
           f"preset {preset!r} sets {', '.join(f'{k}={_get_dotted(preset_data, k)}' for k in tuned)} for the tiny "
           f"model it trains from scratch; with model.path={overrides['model.path']} set them for a pretrained model "
           "(e.g. trainer.lr=1e-6 trainer.sft_lr=1e-5 trainer.sft_all_tokens=false), or use a preset that leaves "
           "them to the pretrained defaults (smoke, smollm2-135m)")


def load_config(preset: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Build the run config from a preset name (or a YAML path) and `a.b=value` overrides."""
    data: dict[str, Any] = {}
    if preset:
        path = Path(preset)
        if path.suffix not in (".yaml", ".yml"):  # a name; "agentbench-qwen2.5-7b" has a dot, not a suffix
            path = PRESETS_DIR / f"{preset}.yaml"
        if not path.exists():
            known = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
            raise ConfigError(f"preset: no preset {preset!r} (known: {', '.join(known)})")
        data = yaml.safe_load(path.read_text()) or {}
        _check(isinstance(data, dict), "preset", f"{path} is not a mapping")
    given = dict(parse_override(item) for item in overrides)
    if preset:
        _check_source(preset, data, given)
    for key, value in given.items():
        _set_dotted(data, key, value)
    return config_from_dict(data)


def to_dict(cfg: Any) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    return _lists(d)


def _lists(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _lists(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_lists(v) for v in node]
    return node


def dump_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML; `load_config(path)` reads it back to an equal config."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
