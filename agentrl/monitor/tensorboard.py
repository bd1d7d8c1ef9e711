"""A thin monitor over TensorBoard's SummaryWriter with the stable metric names of docs/architecture.md §9.

`Monitor` writes event files under run_dir/tb (one file per role process, told apart by a filename
suffix); `NullMonitor` is what non-zero ranks get, so callers never branch on rank. `EventMonitor` is
the same without torch (TensorBoard's own event writer), for roles that never import torch: the env
controller, whose event loop must not stall for the seconds importing torch takes.
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


class EventMonitor:
    """`Monitor`'s scalars and text through TensorBoard's own `EventFileWriter` (no torch import)."""

    def __init__(self, log_dir: str | Path, role: str) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self._w = EventFileWriter(str(log_dir), flush_secs=5, filename_suffix=f".{role}")

    def _add(self, summary: Any, step: int) -> None:
        import time

        from tensorboard.compat.proto.event_pb2 import Event

        self._w.add_event(Event(summary=summary, step=int(step), wall_time=time.time()))

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._add(Summary(value=[Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()]), step)

    def text(self, tag: str, value: str, step: int = 0) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(dtype=7, string_val=[value.encode()],  # 7: DT_STRING
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        self._add(Summary(value=[Summary.Value(tag=tag, metadata=meta, tensor=tensor)]), step)

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


def make_monitor(run_dir: str | Path, role: str, enabled: bool = True, rank: int = 0, torch: bool = True) -> Any:
    """Rank 0's monitor of a role (`torch=False`: the torch-free `EventMonitor`), a `NullMonitor` elsewhere."""
    if not enabled or rank != 0:
        return NullMonitor()
    return (Monitor if torch else EventMonitor)(Path(run_dir) / "tb", role)


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
