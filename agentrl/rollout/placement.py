"""Which GPUs each vLLM engine of a rollout rank runs on (GPU nodes only; CPU engines have no placement).

A rank's engines are numbered 0..E-1 within the rank, current engines first, then lagging ones; engine k takes
the rank's GPUs [k * TP, (k + 1) * TP), counted in the order the process sees them (CUDA_VISIBLE_DEVICES as
Slurm or the user set it, or every GPU of the node when it is unset). `VLLMEngine` starts each engine's
EngineCore process with `CUDA_VISIBLE_DEVICES` set to that slice, so the engine's own device 0..TP-1 are the
slice's GPUs. Pure functions: the caller reads the environment and counts the devices.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence


def visible_gpus(cuda_visible_devices: str | None, device_count: Callable[[], int]) -> list[str]:
    """The GPUs this process sees, as CUDA_VISIBLE_DEVICES entries (indices or UUIDs, in their order).

    Unset: all of the node's (`device_count()` of them, called only then). Set but empty: none."""
    if cuda_visible_devices is None:
        return [str(i) for i in range(device_count())]
    return [d.strip() for d in cuda_visible_devices.split(",") if d.strip()]


def engine_slice(visible: Sequence[str], k: int, tensor_parallel_size: int) -> str:
    """CUDA_VISIBLE_DEVICES for engine `k` of a rank that sees `visible`: its TP GPUs, comma-separated."""
    lo, hi = k * tensor_parallel_size, (k + 1) * tensor_parallel_size
    if k < 0 or tensor_parallel_size < 1 or hi > len(visible):
        raise ValueError(f"engine {k} with tensor_parallel_size {tensor_parallel_size} needs GPUs [{lo}, {hi}) of "
                         f"the rank's, but it sees {len(visible)} ({','.join(visible) or 'none'})")
    return ",".join(visible[lo:hi])


def rank_slices(visible: Sequence[str], engines: int, lagging: int, tensor_parallel_size: int) -> list[str]:
    """One CUDA_VISIBLE_DEVICES value per engine of the rank (`engines` current ones, then `lagging` ones).

    The rank must see exactly the GPUs its engines need, (engines + lagging) x TP: fewer cannot hold them, and
    more means the launcher did not bind this rank to its own GPUs (two ranks of a node that both see all of
    its GPUs would put their engines on the same ones). The error names the config fields to change."""
    need = (engines + lagging) * tensor_parallel_size
    if len(visible) != need:
        raise ValueError(
            f"this rollout rank sees {len(visible)} GPU(s) (CUDA_VISIBLE_DEVICES={','.join(visible) or 'none'}) "
            f"but its engines need exactly (cluster.rollout.engines_per_rank {engines} + "
            f"cluster.rollout.lagging_engines_per_rank {lagging}) x cluster.rollout.tensor_parallel_size "
            f"{tensor_parallel_size} = {need}: bind each rank to its own GPUs (cluster.gpu_binding, or "
            f"CUDA_VISIBLE_DEVICES when run by hand) or change those fields (and cluster.rollout.gpus_per_node)")
    return [engine_slice(visible, k, tensor_parallel_size) for k in range(engines + lagging)]
