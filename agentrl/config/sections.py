"""The run's sections other than `model` and `cluster`: controller, envs, rollout, trainer, algo, transport,
monitor. Each is a frozen dataclass whose field docstrings are its documentation; `validate` checks its own
fields (checks across sections are `RunConfig.validate`'s)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agentrl.config.errors import ConfigError, _check


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
    as env_error. The env client touches every session it holds each `keepalive_s`, so a session
    waiting for a slow generation or a weight sync lives as long as its rollout process does."""
    keepalive_s: float = 30.0
    """How often an env client (the rollout) touches the sessions it holds."""
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
    within this, or it is closed (`agentrl.serving.listener`: half-sent requests from anyone on the network)."""
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
    """Task names served by the env workers (see agentrl.tasks)."""
    workers: int = 1
    slots: int = 256
    """Concurrent sessions one worker accepts."""
    task_options: dict[str, dict[str, object]] = field(default_factory=dict)
    """Constructor options per task, e.g. `{os: {agentbench_dir: /path/AgentBench, sandbox: {backend: bwrap}},
    db: {backend: mariadb, mariadb_address: "db1:3306"}}`: each task declares them as a frozen dataclass (its
    `Options`; the built-in tasks' in `agentrl.tasks.options`), which they are checked against at load."""
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
    trainer.warm_start_steps > 0 and rollout.expert_samples > 0); see `agentrl.serving.process.expert_route_on`."""

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
    groups_per_task: int = 8
    """Samples of each task started per step, each one group (the words: docs/architecture.md §11)."""
    group_size: int = 8
    """n, the group size: episodes of one sample, one GRPO group."""
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
    lagging_prob: float = 0.0
    """Probability that a turn (one generation call) is generated by the lagging pool (cross-policy sampling);
    > 0 needs cluster.rollout.lagging_engines_per_rank >= 1. The paper uses 0.25."""
    linger_ms: float = 5.0
    """CPU engines (in the rank's process): after a step that finished requests, at most how long the engine
    waits for their agent loops to ask for their next turns (or go to the env) before it steps again, so a next
    turn joins the very next step instead of the one after (`VLLMEngine(linger_s=)`); 0: step at once. The wait
    ends as soon as the loops have reacted. On 2 cores 5 ms raised our loop from 0.82 to 0.86 of the
    same-structure replay, higher in each of 3 pairs (`jobs.bench_agent_loop --linger-ms 0,5`; docs/pipeline.md
    §8). Engines of their own process (GPU nodes) do not linger: measured on such an engine (on CPU) it gained
    nothing (0 to -4 % in 3 pairs), since their EngineCore steps on its own while our thread waits."""
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
        for name in ("groups_per_task", "group_size", "max_new_tokens", "max_model_len", "concurrency"):
            _check(getattr(self, name) >= 1, f"{p}.{name}", "must be >= 1")
        _check(self.env_retries >= 0, f"{p}.env_retries", "must be >= 0")
        _check(self.env_wait_s >= 0, f"{p}.env_wait_s", "must be >= 0")
        for name in ("eval_samples", "eval_sampled", "expert_samples"):
            _check(getattr(self, name) >= 0, f"{p}.{name}", "must be >= 0")
        _check(self.temperature >= 0, f"{p}.temperature", "must be >= 0")
        _check(0.0 <= self.lagging_prob <= 1.0, f"{p}.lagging_prob", "must be in [0, 1]")
        _check(0 <= self.linger_ms <= 1000, f"{p}.linger_ms", "must be in [0, 1000] (0: off)")
        # vLLM reports log-probs after top-p renormalisation; the trainer does not re-apply the nucleus,
        # so with top_p < 1 every PPO ratio would be biased. Until it does, RL samples the full distribution.
        _check(self.top_p == 1.0, f"{p}.top_p", "must be 1.0 (the trainer's log-probs do not apply top-p yet)")
        _check(self.max_new_tokens < self.max_model_len, f"{p}.max_new_tokens", "must be < max_model_len")


@dataclass(frozen=True)
class TrainerConfig:
    steps: int = 20
    """RL steps (one optimizer step per batch)."""
    lr: float | Literal["auto"] = 1e-4
    """RL learning rate. This default is tuned for the tiny model trained from scratch; a run from a pretrained
    `model.path` that sets none gets `PRETRAINED_DEFAULTS`' (1e-6, the paper's). auto: a fixed fraction of the
    warm start's rate (`agentrl.trainer.lr_range.RL_FRACTION`, 1/20), measured when `warm_start_lr` is auto too."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch_tokens: int = 8192
    """Gradient accumulation: micro-batches of at most this many tokens."""
    warm_start_steps: int = 200
    """Warm-start optimizer steps on the scripted expert's trajectories (0: none)."""
    warm_start_lr: float | Literal["auto"] = 3e-3
    """Warm-start learning rate; tuned for the tiny model from scratch, 1e-5 for a pretrained `model.path` that
    sets none (`PRETRAINED_DEFAULTS`). auto: measured at the start of the warm start by a short range test on its
    demonstrations (`agentrl.trainer.lr_range`; `python -m jobs.lr_range` prints the same table beforehand)."""
    warm_start_batch: int = 32
    """Demonstrations per warm-start step."""
    control_batch: int = 0
    """Demonstrations per step of the control run (`update=warm_start`) after its warm start; 0: `warm_start_batch`.
    Set it to the RL step's episodes (groups_per_task × tasks × group_size) for a control that imitates as many
    trajectories per step as RL trains on, from the same warm start as the RL run."""
    warm_start_warmup_steps: int = 10
    """Warm-start learning rate: linear warm-up over this many steps, then constant (0 or 1: constant from the
    first step). 10 suits the tiny model's long warm start; a few steps on a pretrained model want none."""
    warm_start_all_tokens: bool = False
    """Warm start on every token of the demonstrations (prompt and observations too), not only the
    actions. For a random-init model this doubles as pre-training on the task's text, which is what
    lets it learn to copy names and values out of its context; leave it off for a pretrained model."""
    warm_start_successful_only: bool = True
    """Warm start on the expert's successful episodes only (rejection sampling). false: imitate all of them,
    mistakes included (the demo's imperfect expert: RL then has to do better than its teacher)."""
    warm_start_target: float = 0.0
    """Stop the warm start before `warm_start_steps` once, for every task, this share of held-out successful
    demonstrations is reproducible (each action token at probability >= warm_start_min_token_prob); 0: run all
    `warm_start_steps`. Makes the warm start end after the copy skills form, wherever that lands on a machine."""
    warm_start_min_token_prob: float = 0.2
    warm_start_check_every: int = 50
    """Warm-start steps between two checks of `warm_start_target`."""
    warm_start_holdout: int = 32
    """Successful demonstrations per task held out of the warm start for `warm_start_target` (at most a quarter)."""
    update: Literal["rl", "warm_start"] = "rl"
    """What each of the `steps` does: rl (train on the rollout's batch) | warm_start (one more warm-start update on
    the expert's demonstrations instead: a control run, to tell RL's gain from more imitation; its rollout ranks play
    no training episode, only the evaluations)."""
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
    (warm start and RL alike). Negative: all but the top this many layers are frozen, whatever the model's depth
    (-10 trains the top 10). 0: every parameter is trained."""
    checkpoint_every: int = 10
    """Write ckpt/step-<N> every this many RL steps (and after the last); 0: never."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept; older ones are deleted once a newer one is complete (a warm start's step-0
    checkpoint stays: `warm_start_from` starts other runs from it)."""
    warm_start_from: str = ""
    """Another run's directory (same seed, model, tasks and warm-start and evaluation settings: what may differ is
    `agentrl.launch.fork.MAY_DIFFER`) whose warm start a fresh run starts from instead of repeating it: its step-0
    checkpoint, expert demonstrations and evaluation before RL are copied in. A seed's control run
    (`update=warm_start`) and ablations (`algo.*`) so share its RL run's warm start and before-RL numbers."""

    def validate(self, p: str) -> None:
        _check(self.steps >= 0, f"{p}.steps", "must be >= 0")
        _check(self.warm_start_steps >= 0, f"{p}.warm_start_steps", "must be >= 0")
        for name in ("lr", "warm_start_lr", "micro_batch_tokens", "warm_start_batch", "threads"):
            _check(getattr(self, name) == "auto" or getattr(self, name) > 0, f"{p}.{name}", "must be positive")
        # lr: auto is a fraction of the warm start's rate: with warm_start_lr auto that rate is measured by the warm
        # start
        _check(not (self.lr == "auto" and self.warm_start_lr == "auto" and self.warm_start_steps == 0), f"{p}.lr",
               "auto with warm_start_lr auto takes the rate the warm start measures, and warm_start_steps=0 runs none: "
               "set trainer.lr (or trainer.warm_start_lr) to a number")
        _check(self.grad_clip >= 0, f"{p}.grad_clip", "must be >= 0 (0 disables clipping)")
        _check(0 <= self.warm_start_target <= 1, f"{p}.warm_start_target", "must be in [0, 1] (0: off)")
        _check(0 < self.warm_start_min_token_prob < 1, f"{p}.warm_start_min_token_prob", "must be in (0, 1)")
        _check(self.warm_start_check_every >= 1, f"{p}.warm_start_check_every", "must be >= 1")
        _check(self.warm_start_holdout >= 1, f"{p}.warm_start_holdout", "must be >= 1")
        _check(self.warmup_steps >= 0, f"{p}.warmup_steps", "must be >= 0")
        _check(self.control_batch >= 0, f"{p}.control_batch", "must be >= 0 (0: warm_start_batch)")
        _check(self.warm_start_warmup_steps >= 0, f"{p}.warm_start_warmup_steps", "must be >= 0")
        _check(self.checkpoint_every >= 0, f"{p}.checkpoint_every", "must be >= 0 (0: never)")
        _check(self.keep_checkpoints >= 1, f"{p}.keep_checkpoints", "must be >= 1")
        _check(not self.warm_start_from or self.warm_start_steps > 0, f"{p}.warm_start_from",
               "starts from another run's warm start: that run's trainer.warm_start_steps (> 0) must be set here too")


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
    """How engines get new weights. dir: versioned safetensors directories (also
    what restarts read); broadcast: the in-job gloo/NCCL broadcast, with the directory still written."""
    min_groups: int = 0
    """Complete GRPO groups a step waits for; 0: one synchronous step's worth (groups_per_task × tasks), which
    is what `cluster.schedule=sync` always takes (there it must stay 0)."""
    max_groups: int = 0
    """The most complete groups one step takes (the dynamic batch); 0: min_groups."""
    group_timeout_s: float = 600.0
    """A group still missing members this long after its first arrived is dropped (counted group_timeout)."""
    queue_capacity: int = 0
    """Trajectories in complete groups at which the trainer's queue stops receiving (back-pressure); 0:
    4 × max_groups × group size. At least min_groups × group size, so that a full queue can release a batch."""
    channel: Literal["mpi", "files"] = "mpi"
    """How trajectories and notices travel. mpi: one MPI world (mpiexec, or srun
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
