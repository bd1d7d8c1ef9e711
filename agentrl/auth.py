"""The per-run secret: every controller and env-worker route requires it.

On a cluster the controller and the workers listen on ports every user of the partition can reach, so
a request must prove it belongs to this run: it carries `Authorization: Bearer <secret>`, compared in
constant time. The secret comes from `AGENTRL_SECRET` when that is set (a launcher that hands it to
its roles in the environment), else from `RUN_DIR/secret`, which whichever role needs it first creates
(owner-only, 0600, written whole before it appears: other roles never read half a secret). Every role of
a run shares the run dir, so a local demo needs no configuration at all.

Standard library only: the launcher (on a login node) may create it too.
"""
from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

ENV_VAR = "AGENTRL_SECRET"
FILE_NAME = "secret"
HEADER = "Authorization"
SCHEME = "Bearer "


class SecretError(RuntimeError):
    """The secret file is unusable (readable by others, empty): refuse to serve rather than run open."""


def run_secret(run_dir: str | os.PathLike[str]) -> str:
    """This run's secret: `$AGENTRL_SECRET` if set, else `run_dir/secret` (created if absent)."""
    from_env = os.environ.get(ENV_VAR, "").strip()
    if from_env:
        return _checked(from_env, ENV_VAR)
    path = Path(run_dir) / FILE_NAME
    if not path.exists():
        _create(path)
    return _checked(_read(path), str(path))


def _checked(secret: str, where: str) -> str:
    """A secret travels in an HTTP header: printable ASCII without spaces (no header injection)."""
    if not (secret.isascii() and secret.isprintable() and " " not in secret):
        raise SecretError(f"the secret in {where} must be printable ASCII without spaces")
    return secret


def _create(path: Path) -> None:
    """Write a fresh secret under a private name, then link it into place: exactly one role's wins."""
    tmp = path.with_name(f".{FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails if another role created it first: theirs is the run's secret
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def _read(path: Path) -> str:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretError(f"{path} is accessible to other users (mode {stat.filemode(mode)}); "
                          f"run `chmod 600 {path}` or remove it to make a new one")
    value = path.read_text().strip()
    if not value:
        raise SecretError(f"{path} is empty; remove it to make a new one")
    return value


def auth_header(secret: str | None) -> dict[str, str]:
    """The header a client sends (none without a secret: an in-process loopback test)."""
    return {HEADER: SCHEME + secret} if secret else {}


def authorized(expected: str, header_value: str | None) -> bool:
    """Whether a request's Authorization header carries `expected` (constant-time comparison)."""
    if not header_value or not header_value.startswith(SCHEME):
        return False
    return hmac.compare_digest(header_value[len(SCHEME):].encode(), expected.encode())
