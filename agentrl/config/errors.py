"""The config's error type and its one check: every problem names the dotted field it is about."""
from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value; the message starts with the dotted field path."""


def _check(cond: bool, path: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{path}: {msg}")
