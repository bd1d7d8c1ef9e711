"""Host-side launcher of a bubblewrap sandbox with many user ids: run by a root worker, never imported.

bubblewrap alone maps one uid into its user namespace, so inside only root exists and `chown jack`
fails. Docker, AgentBench's runtime, has every uid. Mapping a range takes a writer with CAP_SETUID in
the parent namespace, which only a root worker has; this program is that writer. It runs as
`python3 -I -S userns.py CONFIG_JSON -- /usr/bin/bwrap ...` (started by `agentrl.sandbox.shell.Shell`)
and makes two nested user namespaces before it execs bubblewrap in the inner one:

  host root (this program)
   └ A: ids 0..count-1 -> host uids base..base+count-1 (written here, as host root);
        A's user.max_user_namespaces is set to 1, and A's root sets RLIMIT_NPROC to `nproc`
      └ B: ids 0..count-1 -> A's same ids; bubblewrap runs here as root, without --unshare-user

Why two: B is the only user namespace A may hold (the sysctl), and B's root cannot raise A's limit,
so nothing inside creates another user namespace (what bwrap's --disable-userns does). And the kernel
charges every process of B, whatever its uid, to B's creator in A, checked against the RLIMIT_NPROC
the creator had when it made B: `setuid` to another uid does not get a fork bomb a fresh budget.

bubblewrap keeps Docker's default capabilities for the sandbox's root (`--cap-add`); the sandbox's
driver then drops every other one from the bounding set, so that no file capability adds one at exec.

Also set here, as host root: RLIMIT_NOFILE (the hard limit may rise to the kernel's nr_open; Docker
gives 1,048,576 and AgentBench samples open fd 123321), which the sandbox inherits.

Config keys: base (first host uid), count (ids mapped), nproc, nofile. Exit status: bubblewrap's.
Standard library only; `os.unshare` is 3.12+, so it is called through libc.
"""
import ctypes
import json
import os
import resource
import sys

CLONE_NEWUSER = 0x10000000


def unshare_user():
    """Enter a new user namespace, staying dumpable: a process whose ids changed (as ours did, one level
    up) is not, and then its /proc files belong to a root its parent cannot act for, uid_map included."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 1, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 1) failed")
    if libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER) failed")


def write_maps(pid, outside, count):
    """Map ids 0..count-1 of `pid`'s new user namespace onto `outside`..outside+count-1 of ours."""
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(f"0 {outside} {count}\n")


def in_new_namespace(outside, count):
    """Fork; the child enters a new user namespace, which this process maps, and becomes its root.
    Returns the child's pid in the parent, 0 in the child."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        unshare_user()
        os.write(ready_w, b"1")
        if os.read(go_r, 1) != b"1":  # the parent could not map us
            os._exit(125)
        os.setresgid(0, 0, 0)
        os.setgroups([])
        os.setresuid(0, 0, 0)
        return 0
    os.close(ready_w)
    os.close(go_r)
    ok = b"0"
    try:
        if os.read(ready_r, 1) == b"1":
            write_maps(pid, outside, count)
            ok = b"1"
    finally:
        os.write(go_w, ok)
    return pid


def wait_and_exit(pid):
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def main(argv):
    cfg = json.loads(argv[1])
    command = argv[argv.index("--") + 1:]
    count, nproc, nofile = int(cfg["count"]), int(cfg["nproc"]), int(cfg["nofile"])
    if nofile > resource.getrlimit(resource.RLIMIT_NOFILE)[1]:  # lower ones: the driver sets them
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        except ValueError as e:
            raise OSError(f"could not set the nofile limit to {nofile}: {e}") from e
    pid = in_new_namespace(int(cfg["base"]), count)  # A
    if pid:
        wait_and_exit(pid)
    with open("/proc/sys/user/max_user_namespaces", "w") as f:  # A's own limit: B only
        f.write("1\n")
    # B's creator's limit at B's creation bounds all of B; +1 for this process, charged to the same count
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc + 1, nproc + 1))
    pid = in_new_namespace(0, count)  # B
    if pid:
        wait_and_exit(pid)
    os.execv(command[0], command)  # an absolute path: nothing to import where the stdlib may be unreadable


if __name__ == "__main__":
    try:
        main(sys.argv)
    except OSError as e:
        sys.stderr.write(f"agentrl sandbox launcher: {e}\n")
        os._exit(126)
