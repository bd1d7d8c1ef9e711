"""The learner: the policy and everything that updates it, built once per trainer rank.

    model (sharded under FSDP2) · tokenizer's pad id · warm start (unless resuming) · frozen KL reference ·
    optimizer and LR schedule · running state (step, policy version, consumed ids, totals) · checkpoints ·
    published weights

The pipeline's trainer role (`agentrl.trainer.role`) holds one, on the hub and on every other rank alike;
the schedule (what each step trains on, when) is the role's, the update is the learner's. A learner built
in a run dir with a checkpoint resumes from the newest one and skips the warm start (a control run continues
the warm start the checkpoint saved: `checkpoint.WARM_FILE`).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentrl.config import RunConfig, chat_template_text
from agentrl.trainer import checkpoint
from agentrl.trainer.batch import collate
from agentrl.trainer.checkpoint import TrainerState
from agentrl.trainer.lr_range import rl_lr
from agentrl.trainer.model_load import gather_tensors, load_policy, load_reference, tensor_specs
from agentrl.trainer.parallel import Parallel
from agentrl.trainer.step import rl_step
from agentrl.trainer.warm_start import WarmStart, check_control_run
from agentrl.transport import weights as weights_io
from agentrl.transport.shards import ShardReader
from agentrl.types import Trajectory

log = logging.getLogger("agentrl.trainer")


def publish_weights(run_dir: Path, version: int, model: torch.nn.Module, par: Parallel,
                    base: Path | None = None, chat_template: str | None = None) -> None:
    """Whole weights as weights/v<version>, a complete model directory beside `base`'s config and tokenizer
    files (`chat_template`: the run's template instead of the base's), in the model's own dtype. Collective
    (`stage_weights`)."""
    staged = stage_weights(run_dir, version, model, par, base, chat_template=chat_template)
    if staged is not None:
        weights_io.publish_staged(staged)


def stage_weights(run_dir: Path, version: int, model: torch.nn.Module, par: Parallel, base: Path | None = None,
                  write: bool = True, chat_template: str | None = None) -> weights_io.Staged | None:
    """Weights v<version> streamed into a staged directory on rank 0 (None on the other ranks, and with
    `write=False`), one gathered tensor at a time in the model's dtype: each rank casts its shard before
    sending it, so no rank holds a float32 copy, nor rank 0 more than one whole tensor beyond its shards.
    Collective: every rank gathers each tensor in turn."""
    dtype = weights_io.model_dtype(base) if base is not None else None
    tensors = gather_tensors(model, par, dtype)
    if not (par.is_main and write):
        for _ in tensors:  # this rank's shards go to rank 0 (rank 0 without `write` receives and drops them)
            pass
        return None
    return weights_io.stage_model_dir(weights_io.version_dir(run_dir, version), tensor_specs(model, par, dtype),
                                      tensors, base, {"version": version}, chat_template)


def reference_model(run_dir: Path, model_dir: Path, threads: int, par: Parallel, warm_started: bool,
                    attn_implementation: str = "auto") -> torch.nn.Module:
    """The frozen KL reference: the policy as RL found it (after the warm start, if there was one), in the
    compute dtype and sharded like the policy (`model_load.load_reference`; each rank reads its shards)."""
    weights = None
    if warm_started:
        weights = checkpoint.reference_file(run_dir)
        if weights is None:
            raise FileNotFoundError(f"kl_coef > 0 but {checkpoint.ckpt_root(run_dir)} holds no reference weights "
                                    "(was the run started with kl_coef = 0?)")
    return load_reference(model_dir, threads, par, weights, attn_implementation)


class Learner:
    """The policy, its optimizer and its running state on one trainer rank (every rank builds one alike).

    Attributes:
        resume: the checkpoint this learner resumed from (None: a fresh run, warm-started if configured).
        state: step, policy version, consumed trajectory ids and running totals.
        dtype: the published weights' dtype (the model directory's own).
    """

    def __init__(self, run_dir: Path, model_dir: Path, cfg: RunConfig, monitor, par: Parallel | None = None
                 ) -> None:
        t = cfg.trainer
        self.run_dir, self.model_dir, self.t, self.algo = run_dir, model_dir, t, cfg.algo
        self.temperature = cfg.rollout.temperature
        """The sampler's temperature: the update's log-probs divide the logits by it, as the engine did."""
        self.chat_template = (chat_template_text(cfg.model.chat_template, model_dir) if cfg.model.chat_template
                              else None)
        """The run's `model.chat_template`, which every published directory carries instead of the base's."""
        self.par = par = par or Parallel()
        seed = cfg.seed + t.seed
        torch.manual_seed(seed)
        self.model = load_policy(model_dir, t.threads, par, t.activation_checkpointing, t.attn_implementation,
                                 t.freeze_layers)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)  # masked
        self.resume: Path | None = par.broadcast_object(checkpoint.latest(run_dir))  # rank 0 decides for all
        check_control_run(t, self.resume)
        self.warm: WarmStart | None = None
        sft_done = 0
        # a control run resumed, or started from its RL run's warm start: it continues the saved warm start
        control_resumed = self.resume is not None and t.update == "warm_start"
        warm_saved = checkpoint.warm_state(self.resume) if control_resumed else None
        if (self.resume is None and t.warm_start_steps > 0) or warm_saved is not None:
            demos = ShardReader(run_dir / "shards" / "expert-0").wait(0, timeout_s=cfg.cluster.role_timeout_s,
                                                                       poll_s=cfg.transport.poll_s)
        if self.resume is None and t.warm_start_steps > 0:  # every rank: each runs its share of the same batches
            log.info("warm start on %d expert trajectories", len(demos))
            self.warm = WarmStart(self.model, demos, t, seed, self.pad_id, par)
            sft_done = int(self.warm.run(monitor)["sft_steps_done"])
            if cfg.algo.kl_coef > 0:
                checkpoint.save_reference(run_dir, self.model, par)
        elif warm_saved is not None:  # the rates it measured, not a new range test; its state after `load`
            self.warm = WarmStart(self.model, demos, t, seed, self.pad_id, par,
                                  rates=(float(warm_saved["sft_lr"]), float(warm_saved["lr"])))
        self.ref_model = (reference_model(run_dir, model_dir, t.threads, par, t.warm_start_steps > 0,
                                          t.attn_implementation) if cfg.algo.kl_coef > 0 else None)
        lr = rl_lr(self.warm.t if self.warm is not None else t)  # `lr: auto`: from the rate the warm start measured
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=t.weight_decay)
        warmup = max(t.warmup_steps, 1)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda i: min(1.0, (i + 1) / warmup))
        self.state = TrainerState()
        self.state.stats["sft_steps"] = float(sft_done)
        if self.resume is not None:
            self.state = checkpoint.load(self.resume, self.model, self.opt, self.sched, par,
                                         self.warm.opt if self.warm is not None else None)
            if self.warm is not None and warm_saved is not None:
                self.warm.load_state_dict(warm_saved)
                log.info("control run: continuing the warm start from %s (%d imitation steps done)", self.resume,
                         self.warm.done)
        self.dtype = weights_io.model_dtype(model_dir)
        self.checkpoint_extra: Callable[[], dict[str, Any]] | None = None
        """Set by the hub: more JSON files for each checkpoint, written inside it before it is in place."""

    @property
    def control(self) -> bool:
        """The control run (`trainer.update=warm_start`): every step is another warm-start step instead of RL."""
        return self.warm is not None and self.t.update == "warm_start"

    @property
    def lr(self) -> float:
        """The rate the next update uses."""
        return float(self.opt.param_groups[0]["lr"])

    def update(self, usable: list[Trajectory], rewards: list[float]) -> dict[str, float]:
        """One step's update, the same on every rank: an imitation step (the control run), an RL step on the
        batch, or none when nothing was usable ({})."""
        if self.control:
            assert self.warm is not None
            return self.warm.step(self.t.control_batch)
        if not usable:
            return {}
        self.model.train()
        return rl_step(self.model, self.opt, collate(usable, rewards, self.pad_id), self.algo, self.t,
                       self.temperature, self.ref_model, self.par)

    def publish_current(self) -> None:
        """weights/v<policy version> from this learner's weights. Collective."""
        publish_weights(self.run_dir, self.state.policy_version, self.model, self.par, self.model_dir,
                        self.chat_template)

    def save(self) -> Path:
        """ckpt/step-<N> (keeping `trainer.keep_checkpoints`). Collective."""
        extra = self.checkpoint_extra() if self.checkpoint_extra is not None and self.par.is_main else None
        # the warm start's own state: at step 0 (another run of this seed may start from it) and in a control run
        keep_warm = self.warm is not None and (self.control or self.state.step == 0)
        warm = (self.warm.opt, self.warm.state_dict()) if keep_warm and self.warm is not None else None
        return checkpoint.save(self.run_dir, self.state, self.model, self.opt, self.sched, self.par,
                               self.t.keep_checkpoints, extra, warm)

    def end_step(self, publish: Callable[[weights_io.Staged], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> bool:
        """After an update, on every rank: advance the LR schedule and the version, hand the new weights to
        `publish` (the hub's), staged on disk (`stage_weights`: streamed tensor by tensor in the published
        dtype; `Publisher` puts them in place), agree on the hub's stop signal, checkpoint when due (every
        `trainer.checkpoint_every` steps, after the last, on a stop).

        Returns:
            whether to stop (the hub's signal).
        """
        if not self.control:  # the control's updates step the warm start's own schedule (`WarmStart.step`)
            self.sched.step()
        self.state.step += 1
        self.state.policy_version += 1
        par = self.par
        staged = stage_weights(self.run_dir, self.state.policy_version, self.model, par, self.model_dir,
                               write=publish is not None, chat_template=self.chat_template)
        if publish is not None and staged is not None:
            publish(staged)
        stop = bool(par.broadcast_object(par.is_main and should_stop is not None and should_stop()))
        every = self.t.checkpoint_every
        due = stop or bool(every) and (self.state.step % every == 0 or self.state.step == self.t.steps)
        if due:
            self.save()
        return stop
