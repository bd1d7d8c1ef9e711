from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.transport import weights


def _state() -> dict[str, torch.Tensor]:
    emb = torch.randn(10, 4)
    return {"model.embed_tokens.weight": emb, "model.norm.weight": torch.ones(4), "lm_head.weight": emb}


def test_publish_and_read_back_with_tied_weights(tmp_path: Path) -> None:
    sd = _state()
    path = weights.publish(tmp_path, 0, sd)
    assert path == tmp_path / "weights" / "v0" and (path / "meta.json").exists()
    back = dict(weights.iter_weights(path))
    assert set(back) == set(sd)  # the tied head is written too: vLLM's CPU backend needs it
    for k in sd:
        torch.testing.assert_close(back[k], sd[k])


def test_versions_keep_last_and_wait(tmp_path: Path) -> None:
    for v in range(5):
        weights.publish(tmp_path, v, _state(), keep_last=2)
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v3", "v4"]
    assert weights.latest_version(tmp_path) == 4
    assert weights.wait_for(tmp_path, 4, timeout_s=1) == tmp_path / "weights" / "v4"
    with pytest.raises(TimeoutError, match="v5"):
        weights.wait_for(tmp_path, 5, timeout_s=0.1, poll_s=0.02)


def test_no_partial_version_is_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(weights, "write_tensors", boom)
    with pytest.raises(OSError):
        weights.publish(tmp_path, 1, _state())
    assert weights.latest_version(tmp_path) == -1
    assert list((tmp_path / "weights").iterdir()) == []  # the temp dir is cleaned up too


def test_discard_newer_removes_a_lost_lineage(tmp_path: Path) -> None:
    state = {"w": torch.zeros(2)}
    for v in range(5):
        weights.publish(tmp_path, v, {"w": torch.full((2,), float(v))}, keep_last=10)
    assert weights.discard_newer(tmp_path, 2) == [3, 4]
    assert weights.latest_version(tmp_path) == 2
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v0", "v1", "v2"]  # nothing left aside
    assert weights.discard_newer(tmp_path, 2) == []
    weights.publish(tmp_path, 3, state)  # the resumed trainer's own v3
    assert dict(weights.iter_weights(weights.version_dir(tmp_path, 3)))["w"].sum() == 0
