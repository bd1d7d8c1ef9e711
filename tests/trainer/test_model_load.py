"""The trainer's models without a float32 copy on every rank: 2 gloo ranks load a bf16 stand-in under FSDP2
(meta-device build, rank 0 reads the files, each rank gets its shard), the KL reference in the compute dtype,
and the whole weights gathered to rank 0 tensor by tensor in the published dtype. The result must be the
model `from_pretrained` loads: same tensors, same buffers, same logits."""
from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import model_load_worker as w
import pytest
import torch
import trainer_procs as procs_

from agentrl.models import standins, tiny
from agentrl.trainer.model_load import load_model, weight_files
from agentrl.transport.tensor_file import read_header, read_rows


def read_safetensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a model directory's safetensors files, one at a time, by our own reader."""
    for path in weight_files(model_dir):
        with open(path, "rb") as f:
            for name, entry in read_header(path).items():
                yield name, read_rows(f, entry)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("load")
    model_dir = standins.build("qwen2.5", root / "model", hidden_size=128, num_layers=2)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tiny.save(tiny.build_model(tok, 64, 1, 1, 128, 256, seed=0), tok, root / "tied")
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    procs = [procs_.start(w.main, (model_dir, root, root / "tied"), root, f"rank{r}", {**env, "RANK": str(r)}) for r in range(2)]
    procs_.join_all(procs, timeout_s=180)
    assert all(p.exitcode == 0 for p in procs), procs_.errors_of(root) or [p.exitcode for p in procs]
    return model_dir, [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(2)] + [
        torch.load(root / f"tied{r}.pt", weights_only=False) for r in range(2)]


def test_sharded_load_is_the_pretrained_model(loaded) -> None:
    model_dir, (r0, r1, _, _) = loaded
    want = load_model(model_dir, 1)
    files = dict(read_safetensors(model_dir))
    assert r0["whole"].keys() == want.state_dict().keys() and r1["whole"] == {}  # whole weights: rank 0 only
    for k, v in r0["whole"].items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, files[k]), k  # the files' bf16 values, exactly
    for name, b in want.named_buffers():  # rotary tables are computed, not read: materialised right
        assert torch.equal(r0["buffers"][name], b) and torch.equal(r1["buffers"][name], b), name
    with torch.no_grad():
        logits = want(input_ids=torch.arange(1, 17)[None]).logits.float()
    assert torch.allclose(r0["logits"], logits, atol=0.05, rtol=0)  # bf16 compute on both ranks vs fp32
    assert torch.equal(r0["logits"], r1["logits"])


def test_loaded_master_weights_are_the_files_bit_for_bit(loaded) -> None:
    model_dir, (r0, r1, _, _) = loaded
    files = dict(read_safetensors(model_dir))
    assert r1["whole32"] == {} and r0["whole32"].keys() == files.keys()
    for k, v in r0["whole32"].items():
        assert v.dtype == torch.float32 and torch.equal(v, files[k].float()), k


def test_published_weights_load_in_transformers_as_the_trained_bf16_parameters(loaded) -> None:
    from transformers import AutoModelForCausalLM

    model_dir, (r0, _, _, _) = loaded
    pub = model_dir.parent / "run" / "weights" / "v1"
    served = AutoModelForCausalLM.from_pretrained(str(pub)).state_dict()
    assert served.keys() == r0["trained"].keys()
    for k, v in r0["trained"].items():
        assert served[k].dtype == torch.bfloat16 and torch.equal(served[k], v.to(torch.bfloat16)), k
    assert not torch.equal(served["model.norm.weight"], dict(read_safetensors(model_dir))["model.norm.weight"])


def test_saved_reference_reloads_sharded_bit_for_bit(loaded) -> None:
    _, (r0, r1, _, _) = loaded
    assert r1["ref2"] == {} and r0["ref2"].keys() == r0["trained"].keys()
    for k, v in r0["trained"].items():
        assert r0["ref2"][k].dtype == torch.float32 and torch.equal(r0["ref2"][k], v), k


def test_each_rank_holds_half_the_policy_and_a_bf16_reference(loaded) -> None:
    model_dir, (r0, r1, _, _) = loaded
    whole_fp32 = sum(t.numel() * 4 for t in load_model(model_dir, 1).state_dict().values())
    for r in (r0, r1):
        assert r["policy_dtypes"] == ["torch.float32"]  # master weights stay float32 ...
        assert 0.4 * whole_fp32 <= r["local_bytes"] <= 0.6 * whole_fp32  # ... but half of them per rank
        assert r["ref_dtypes"] == ["torch.bfloat16"]  # the frozen reference in the compute dtype


def test_tied_embeddings_load_sharded(loaded, tmp_path_factory) -> None:
    model_dir, (_, _, t0, t1) = loaded
    want = load_model(model_dir.parent / "tied", 1).state_dict()
    assert t1 == {} and t0.keys() == want.keys()
    assert all(torch.equal(t0[k], want[k]) for k in want)
    assert torch.equal(t0["lm_head.weight"], t0["model.embed_tokens.weight"])


def test_the_thread_count_holds_after_vllm_made_torch_set_num_threads_a_no_op(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-process vLLM CPU engine replaces torch.set_num_threads with a no-op for the rest of the process;
    a model loaded afterwards must still compute on the trainer's count (CI: a test's reference update ran on
    2 threads beside a 1-thread trainer and missed it by more than 1e-7)."""
    model_dir = standins.build("qwen2.5", tmp_path / "m", hidden_size=64, num_layers=1)
    before = torch.get_num_threads()
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    want = 2 if before == 1 else 1
    try:
        load_model(model_dir, want)
        assert torch.get_num_threads() == want
    finally:
        torch._C.set_num_threads(before)
