"""Process setup the serving roles share (the controller, the env workers, their benchmark).

The file-descriptor limit, the event loop, and the run-level switch for the expert route: code every
serving entry point in `jobs/` needs, kept here because entry points never import one another.
"""
from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Callable

from agentrl.config import RunConfig


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit: 10,000 sessions need more sockets than the usual 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(soft, 65536) if hard == resource.RLIM_INFINITY else hard
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop where it is installed (about twice the calls per second of a controller), else asyncio's.

    AGENTRL_UVLOOP=0 forces asyncio's (to compare). uvloop is optional: nothing requires it.
    """
    if os.environ.get("AGENTRL_UVLOOP", "1") != "0":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def expert_route_on(cfg: RunConfig) -> bool:
    """Whether this run's workers answer /expert.

    The scripted expert hands out answers, so the route is off unless the run plays it: `auto` (the
    default) turns it on for `rollout.engine: expert` and for a warm start (`trainer.warm_start_steps > 0`
    with `rollout.expert_samples > 0`, the rollout's ExpertEngine playing train samples).
    """
    choice = cfg.envs.expert_route
    if choice != "auto":
        return choice == "enabled"
    return cfg.rollout.engine == "expert" or (cfg.trainer.warm_start_steps > 0 and cfg.rollout.expert_samples > 0)
