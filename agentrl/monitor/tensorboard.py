"""A thin monitor over TensorBoard's SummaryWriter with the stable metric names of design §9.

`Monitor` writes event files under run_dir/tb (one file per role process, told apart by a filename
suffix); `NullMonitor` is what non-zero ranks get, so callers never branch on rank.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol


class MonitorLike(Protocol):
    def scalars(self, values: Mapping[str, float], step: int) -> None: ...
    def text(self, tag: str, value: str, step: int = 0) -> None: ...
    def close(self) -> None: ...


class Monitor:
    def __init__(self, log_dir: str | Path, role: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self._w = SummaryWriter(log_dir=str(log_dir), filename_suffix=f".{role}", flush_secs=5)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for k, v in values.items():
            self._w.add_scalar(k, float(v), step)

    def text(self, tag: str, value: str, step: int = 0) -> None:
        self._w.add_text(tag, value, step)

    def close(self) -> None:
        self._w.flush()
        self._w.close()


class NullMonitor:
    def scalars(self, values: Mapping[str, float], step: int) -> None:
        pass

    def text(self, tag: str, value: str, step: int = 0) -> None:
        pass

    def close(self) -> None:
        pass


def make_monitor(run_dir: str | Path, role: str, enabled: bool = True, rank: int = 0) -> Any:
    return Monitor(Path(run_dir) / "tb", role) if enabled and rank == 0 else NullMonitor()


def config_text(cfg: Any) -> str:
    """The resolved config as TensorBoard markdown: YAML in a code block (indented four spaces, which
    TensorBoard's text plugin renders as preformatted text with no fence handling needed). `cfg` is a
    `RunConfig` (or any dataclass tree) or an already plain dict."""
    import dataclasses

    import yaml

    from agentrl.config import to_dict

    body = to_dict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)
    return "\n".join("    " + line for line in yaml.safe_dump(body, sort_keys=False).splitlines())


def write_config(monitor: MonitorLike, cfg: Any, tag: str = "config") -> None:
    """Log the resolved config once, as text at step 0 (style §5: the config in the run dir and in TB)."""
    monitor.text(tag, config_text(cfg), 0)
