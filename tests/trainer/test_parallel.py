"""Data parallelism is exact: 2 real gloo ranks on CPU (DDP padded, DDP packed, FSDP2 packed) make the same
update as 1 rank on the whole batch, and an FSDP2 checkpoint restores into fresh shards and into 1 rank."""
from __future__ import annotations

import socket
from pathlib import Path

import dist_trainer_worker as w
import naive_rl
import pytest
import torch
import trainer_procs as procs_

from agentrl.trainer import checkpoint, parallel
from agentrl.trainer.batch import collate
from agentrl.trainer.parallel import DistEnv, Parallel, dist_env, resolve_dtype
from agentrl.trainer.step import rl_step


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranks")
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    procs = [procs_.start(w.main, (out,), out, f"rank{r}", {**env, "RANK": str(r)}) for r in range(2)]
    procs_.join_all(procs, timeout_s=120)
    assert all(p.exitcode == 0 for p in procs), procs_.errors_of(out) or [p.exitcode for p in procs]
    return out


@pytest.fixture(scope="module")
def one_rank() -> dict[bool, dict]:
    """1 rank, whole batch, one padded micro-batch, per tied/untied head: the update the ranks must reproduce."""
    trajs = w.trajectories()
    batch = collate(trajs, [t.reward for t in trajs], pad_id=0)
    out = {}
    for tied in (True, False):
        model = w.tiny_model(0, tied)
        opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
        stats = rl_step(model, opt, batch, w.ALGO, w.trainer_config(False, 100_000), w.TEMPERATURE,
                        w.reference_model(tied), Parallel())
        out[tied] = {"state": {k: v.clone() for k, v in model.state_dict().items()}, "stats": stats}
    return out


@pytest.mark.parametrize("layout", list(w.LAYOUTS))
def test_two_ranks_make_the_naive_full_vocabulary_update(two_ranks: Path, layout: str) -> None:
    """The lean head under DDP and FSDP2 (the head's weight unsharded inside the root's forward, tied or not) makes
    the update of the naive loss: one padded forward, the whole float32 log-softmax, clipped as torch clips."""
    tied = w.LAYOUTS[layout][2]
    trajs = w.trajectories()
    batch = collate(trajs, [t.reward for t in trajs], pad_id=0)
    t = w.trainer_config(False, 1)
    model = w.tiny_model(0, tied)
    loss, stats = naive_rl.rl_loss(model, batch, w.ALGO, w.TEMPERATURE, w.reference_model(tied))
    expected = naive_rl.update(model, loss, t.grad_clip)
    got, init = torch.load(two_ranks / f"{layout}.pt"), model.state_dict()
    scale = max(float(d.abs().max()) for d in expected.values())
    for k in expected:  # float32 weights near 1 (the norms') keep their step to ~1e-7: 2 ulps on top
        torch.testing.assert_close(got["state"][k] - init[k], expected[k], rtol=0, atol=1e-5 * scale + 2.4e-7, msg=k)
    for k, v in stats.items():
        assert got["stats"][k] == pytest.approx(v, rel=1e-5, abs=1e-7), k


@pytest.mark.parametrize("layout", list(w.LAYOUTS))
def test_two_ranks_make_the_one_rank_update(two_ranks: Path, one_rank: dict, layout: str) -> None:
    tied = w.LAYOUTS[layout][2]
    got = torch.load(two_ranks / f"{layout}.pt")
    ref, init = one_rank[tied]["state"], w.tiny_model(0, tied).state_dict()
    assert set(got["state"]) == set(ref)
    step = {k: ref[k] - init[k] for k in ref}
    scale = max(float(d.abs().max()) for d in step.values())
    assert scale > 1e-3  # the step moved the weights, so agreement below means something
    for k in ref:  # float32: ~1e-5 of the update's size, where an error of averaging or of the clip norm is 1
        torch.testing.assert_close(got["state"][k] - init[k], step[k], rtol=0, atol=1e-5 * scale)
    s, r = got["stats"], one_rank[tied]["stats"]
    assert r["grad_norm"] > w.trainer_config(False, 1).grad_clip  # clipping was active: its norm must be global
    for k in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "clipfrac", "action_tokens"):
        assert s[k] == pytest.approx(r[k], rel=1e-5, abs=1e-7), k
    assert s["micro_batches"] % 2 == 1  # an odd count: one rank also ran an empty stand-in
    if "packed" in layout:
        assert s["padding_frac"] < r["padding_frac"]


def test_fsdp2_checkpoint_restores_into_fresh_shards_and_into_one_rank(two_ranks: Path) -> None:
    cont = torch.load(two_ranks / "fsdp2-continued.pt")["state"]
    resumed = torch.load(two_ranks / "fsdp2-resumed.pt")["state"]
    first = torch.load(two_ranks / "fsdp2-packed.pt")["state"]
    for k in cont:  # same weights and momentum restored: the second step matches bit for bit
        assert torch.equal(cont[k], resumed[k]), k
    assert any(not torch.equal(cont[k], first[k]) for k in cont)
    # the 2-rank sharded checkpoint loads into a single unwrapped model (DCP reshards)
    model = w.tiny_model(7)
    opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    state = checkpoint.load(checkpoint.latest(two_ranks / "run"), model, opt, None, Parallel())
    assert state.step == 1 and len(state.consumed) == len(w.trajectories())
    for k, v in model.state_dict().items():
        assert torch.equal(v, first[k]), k
    assert all("momentum_buffer" in s for s in opt.state.values()) and len(opt.state) > 0


def test_compute_dtype_and_the_warning_for_emulated_bf16(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """auto is float32 on a CPU; bf16 asked on a CPU that only emulates it works but says what it costs."""
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) is None and resolve_dtype("fp32", cpu) is None
    monkeypatch.setattr(parallel, "cpu_has_fast_bf16", lambda: True)
    with caplog.at_level("WARNING", logger="agentrl.trainer"):
        assert resolve_dtype("bf16", cpu) is torch.bfloat16
    assert not caplog.records
    monkeypatch.setattr(parallel, "cpu_has_fast_bf16", lambda: False)
    with caplog.at_level("WARNING", logger="agentrl.trainer"):
        assert resolve_dtype("bf16", cpu) is torch.bfloat16
    assert "without native bf16" in caplog.text and "trainer.mixed_precision=auto" in caplog.text
    assert isinstance(parallel.cpu_has_fast_bf16(), bool)
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        resolve_dtype("fp16", cpu)


def test_dist_env_reads_torchrun_and_slurm_variables() -> None:
    assert dist_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == DistEnv(3, 4, 1)
    slurm = {"SLURM_PROCID": "2", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", "MASTER_ADDR": "n1", "MASTER_PORT": "1"}
    assert dist_env(slurm) == DistEnv(2, 8, 0)
    assert dist_env({"SLURM_PROCID": "2", "SLURM_NTASKS": "8"}) == DistEnv()  # no rendezvous address: one rank
    with pytest.raises(ValueError, match="parallel"):
        Parallel("none", DistEnv(0, 2, 0))


@pytest.mark.parametrize("override, field", [("trainer.parallel=tp", "trainer.parallel"),
                                             ("trainer.mixed_precision=fp8", "trainer.mixed_precision"),
                                             ("trainer.keep_checkpoints=0", "trainer.keep_checkpoints"),
                                             ("trainer.checkpoint_every=-1", "trainer.checkpoint_every")])
def test_config_names_the_bad_trainer_field(override: str, field: str) -> None:
    from agentrl.config import ConfigError, load_config

    assert load_config(None, ["trainer.parallel=fsdp2", "trainer.mixed_precision=bf16"]).trainer.parallel == "fsdp2"
    with pytest.raises(ConfigError, match=f"^{field}:"):
        load_config(None, [override])
