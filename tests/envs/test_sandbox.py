"""The per-session sandbox: backend choice, command lines and the session's file system (pure), then
real bubblewrap sessions on the project's own root file system: state across commands, nothing of the
host visible, no network, bounded disk, limits that hold or fail the start, fork bombs and endless
loops stopped while another session keeps working, output caps, cleanup."""
from __future__ import annotations

import io
import os
import socket
import tarfile
import threading
import time
from pathlib import Path

import pytest
from sandbox_helpers import require_sandbox

from agentrl import sandbox as sb
from agentrl.sandbox import SandboxConfig, SandboxError, SandboxUnavailable, Shell
from agentrl.sandbox import config as sandbox_config
from agentrl.sandbox import shell as sandbox_shell


@pytest.fixture
def needs_sandbox() -> None:
    require_sandbox()


def fast(**kw: object) -> SandboxConfig:
    return SandboxConfig(backend="bwrap", command_timeout_s=float(kw.pop("timeout", 3.0)), **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ pure parts

def test_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    have: set[str] = set()
    monkeypatch.setattr(sandbox_shell.shutil, "which", lambda name: f"/usr/bin/{name}" if name in have else None)
    with pytest.raises(SandboxUnavailable, match="install Apptainer or bubblewrap"):
        sb.select_backend("auto")
    assert sb.select_backend("auto", isolation=False) == "none"
    with pytest.raises(SandboxUnavailable, match="isolation off"):
        sb.select_backend("none")
    have.add("bwrap")
    assert sb.select_backend("auto") == "bwrap"
    with pytest.raises(SandboxUnavailable, match="Apptainer was asked for"):
        sb.select_backend("apptainer")
    have.add("apptainer")
    assert sb.select_backend("auto") == "apptainer" and sb.select_backend("bwrap") == "bwrap"
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        sb.select_backend("docker")


def test_apptainer_command_line() -> None:
    argv = sb.apptainer_argv("/img/os.sif", {}, {"HOME": "/root"}, ["python3", "-c", "x"], "box", fakeroot=True)
    assert argv[:2] == ["apptainer", "exec"]
    for flag in ("--containall", "--writable-tmpfs", "--fakeroot", "--cleanenv"):
        assert flag in argv
    assert "--bind" not in argv  # the os sessions bind nothing of the host
    assert argv[argv.index("--network") + 1] == "none" and "--net" in argv
    assert argv[argv.index("--hostname") + 1] == "box"
    assert argv[argv.index("--env") + 1] == "HOME=/root"
    assert argv[-4:] == ["/img/os.sif", "python3", "-c", "x"]
    assert "--fakeroot" not in sb.apptainer_argv("i", {}, {}, ["true"], "h", fakeroot=False)
    assert sb.apptainer_argv("i", {"/a": "/b"}, {}, ["true"], "h")[-4:-2] == ["--bind", "/a:/b"]


def test_bwrap_command_line() -> None:
    argv = sb.bwrap_argv(["--ro-bind", "/img/usr/bin", "/usr/bin"], ["python3"], "box", disk_mb=100, shm_mb=8)
    assert argv[0] == "bwrap"
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                 "--as-pid-1", "--clearenv"):
        assert flag in argv
    assert "--share-net" not in argv and "--bind" not in argv  # nothing of the host is writable
    i = argv.index("--tmpfs")
    assert argv[i - 2:i + 2] == ["--size", str(100 << 20), "--tmpfs", "/"]  # a bounded root first
    assert argv.index("--ro-bind") > i
    j = argv.index("/dev/shm")
    assert argv[j - 3:j + 3] == ["--size", str(8 << 20), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    assert argv[-2:] == ["--", "python3"]


def test_bwrap_command_line_in_a_prepared_user_namespace() -> None:
    argv = sb.bwrap_argv([], ["python3"], "box", disk_mb=100, shm_mb=8, in_userns=True)
    # the launcher made the user namespace and disabled further ones: bwrap must not make its own
    assert not {"--unshare-all", "--unshare-user", "--disable-userns", "--uid"} & set(argv)
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--assert-userns-disabled"):
        assert flag in argv
    i = argv.index("--cap-drop")
    assert argv[i + 1] == "ALL"
    added = {argv[j + 1] for j in range(len(argv)) if argv[j] == "--cap-add"}
    # the driver alone (PID 1) gets CAP_SYS_ADMIN (the graders' views, the session's /proc files) and
    # CAP_SYS_PTRACE (sysinfo's answers); it leaves every session's bounding set
    assert added == set(sb.DOCKER_CAPS) | {"CAP_SYS_ADMIN", "CAP_SYS_PTRACE"} and len(added) == 16


def test_launch_command_of_a_root_worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sandbox_shell.os, "geteuid", lambda: 0)
    monkeypatch.setattr(sandbox_config, "has_capability", lambda cap: False)
    cfg = SandboxConfig(backend="bwrap", image=str(fake_image(tmp_path)))
    assert cfg.many_uids("bwrap") and cfg.sandbox_uid("bwrap") == cfg.uid_base
    assert not SandboxConfig(uid_count=1).many_uids("bwrap") and SandboxConfig(uid_count=1).sandbox_uid("bwrap") == 65534
    assert not cfg.many_uids("apptainer") and cfg.sandbox_uid("none") is None
    hard = sandbox_config.resource.getrlimit(sandbox_config.resource.RLIMIT_NOFILE)[1]
    # the session's share of the host's file table, per holder (its processes, its uids' files in flight)
    share = (sandbox_config.file_share(cfg) - (cfg.user_uids + 2) * sandbox_config.SCM_MAX_FD) // cfg.holders()
    assert cfg.nofile() == min(hard, share)  # cannot raise: the hard limit
    monkeypatch.setattr(sandbox_config, "has_capability", lambda cap: cap == sb.CAP_SYS_RESOURCE)
    assert cfg.nofile() == min(max(min(sb.DOCKER_NOFILE, sb.nr_open()), hard), share)
    assert cfg.nofile(host_file_max=1 << 40) == max(min(sb.DOCKER_NOFILE, sb.nr_open()), hard)  # a huge table
    assert SandboxConfig(open_files=4096).nofile() == 4096
    shell = Shell.__new__(Shell)
    shell.cfg, shell.backend, shell.uid_base = cfg, "bwrap", cfg.uid_range(3)  # the fourth live session's range
    argv = shell.argv(seccomp_fd=7)
    assert argv[1:4] == ["-I", "-S", str(sandbox_shell.USERNS_LAUNCHER)] and argv[5] == "--"
    assert json_loads(argv[4]) == {"base": 2_000_000_000 + 3 * 65536, "count": 65536, "nproc": 64,
                                   "nofile": cfg.nofile()}
    assert Path(argv[6]).name == "bwrap" and Path(argv[6]).is_absolute() and "--cap-add" in argv
    assert argv[argv.index("--seccomp") + 1] == "7"
    # ranges stay below 2**32 - 1 (no uid), and wrap around past the last that fits
    last = (2**32 - 2 - cfg.uid_base) // cfg.uid_count - 1
    assert cfg.uid_range(last) + cfg.uid_count <= 2**32 - 1 and cfg.uid_range(last + 1) == cfg.uid_base


def json_loads(text: str) -> object:
    import json
    return json.loads(text)


def fake_image(tmp_path: Path) -> Path:
    image = tmp_path / "image"
    for d in ("usr/bin", "usr/lib", "usr/local/bin", "usr/local/lib", "etc/python3.11", "etc/ld.so.conf.d",
              "var/lib/dpkg", "var/cache", "var/log", "root", "home", "tmp"):
        (image / d).mkdir(parents=True)
    (image / "bin").symlink_to("usr/bin")
    (image / "etc/passwd").write_text("root:x:0:0::/root:/bin/bash\n")
    (image / "etc/ld.so.preload").write_text("")
    (image / "etc/ld.so.cache").write_text("cache")
    (image / "var/log/dpkg.log").write_text("log")
    (image / "root/.bashrc").write_text("# rc")
    return image


def test_mount_plan_and_seed(tmp_path: Path) -> None:
    image = fake_image(tmp_path)
    args = sb.plan_mounts(image)
    pairs = {(args[i], args[i + 2]): args[i + 1] for i in range(len(args)) if args[i] in ("--ro-bind", "--symlink")}
    assert pairs[("--symlink", "/bin")] == "usr/bin"
    assert pairs[("--ro-bind", "/usr/bin")] == str(image / "usr/bin")
    assert ("--ro-bind", "/usr/local") not in pairs and pairs[("--ro-bind", "/usr/local/lib")] == str(image / "usr/local/lib")
    for pinned in ("/etc/ld.so.preload", "/etc/ld.so.cache", "/etc/ld.so.conf.d", "/etc/python3.11", "/var/lib"):
        assert ("--ro-bind", pinned) in pairs, pinned
    assert ("--ro-bind", "/etc/passwd") not in pairs and ("--ro-bind", "/root") not in pairs
    assert "/usr/lib/agentrl" not in args
    (image / "usr/lib/agentrl/bin").mkdir(parents=True)  # an image of before 2026-12-02: its grader tools hidden
    legacy = sb.plan_mounts(image)
    i = legacy.index("/usr/lib/agentrl")
    assert legacy[i - 3:i + 3] == ["--size", "4096", "--tmpfs", "/usr/lib/agentrl", "--remount-ro", "/usr/lib/agentrl"]
    with tarfile.open(fileobj=io.BytesIO(sb.seed_archive(str(image)))) as tar:
        names = {m.name: m for m in tar.getmembers()}
    assert {"etc/passwd", "var/log/dpkg.log", "root/.bashrc", "usr/local/bin", "home", "run"} <= set(names)
    assert not {"etc/ld.so.preload", "etc/ld.so.cache", "etc/python3.11", "var/lib", "usr/local/lib"} & set(names)
    assert names["tmp"].mode == 0o1777 and names["etc/passwd"].uid == 0


def test_process_budget() -> None:
    cfg = SandboxConfig(nproc=64, pid_fraction=0.5)
    big = {"host_file_max": 1 << 40, "ptys": 1 << 20}
    assert sb.session_budget(cfg, host_pid_max=32768, **big) == 256
    sb.check_slots(cfg, 256, host_pid_max=32768, **big)
    with pytest.raises(ValueError, match=r"257 sandbox slots exceed this host's pids budget \(0.5 of pid_max "
                                         r"32768 over 64 processes\): at most 256 slots"):
        sb.check_slots(cfg, 257, host_pid_max=32768, **big)
    assert sb.pid_max() == int(Path("/proc/sys/kernel/pid_max").read_text())


def test_missing_root_file_system_names_the_command(tmp_path: Path) -> None:
    cfg = SandboxConfig(backend="bwrap", image=str(tmp_path / "nothing"))
    with pytest.raises(SandboxUnavailable, match=r"python -m jobs.make_rootfs --out .*nothing"):
        sb.check_image(cfg, "bwrap")


def test_unsandboxed_backend_for_trusted_debugging() -> None:
    sh = Shell(SandboxConfig(backend="none", isolation=False, command_timeout_s=5.0))
    try:
        home = str(sh._dir)
        assert sh.run("pwd; X=2; cd /").output == f"{home}\n"  # HOME is a fresh session directory
        assert sh.run("echo $X $(pwd)").output == "2 /\n"
        assert sh.run_independent(["bash", "-c", "pwd"]).output == f"{home}\n"
    finally:
        sh.close()
    assert not Path(home).exists()


# ------------------------------------------------------------------------------------ real sandboxes

def test_shell_keeps_state_and_reports_exit_codes(needs_sandbox: None) -> None:
    sh = Shell(fast())
    try:
        r = sh.run("pwd; X=41; f() { echo fn$1; }; alias ll='echo aliased'; cd /tmp && echo hi > /root/note.txt; id -u; hostname")
        assert (r.output, r.exit_code) == ("/root\n0\nagentrl-sandbox\n", 0)  # starts in /root, as AgentBench
        assert sh.run("echo $((X + 1)) $(pwd) $(cat /root/note.txt) $(f 7); ll").output == "42 /tmp hi fn7\naliased\n"
        assert (sh.run("printf abc; false").output, sh.run("printf abc; false").exit_code) == ("abc", 1)
        assert sh.run("cat").output == ""  # a command that reads stdin gets /dev/null
        assert sh.run("echo a\0b").output == "ab\n"  # NULs cannot reach a program: dropped
        assert sh.run("exit 3").exit_code == 3
        assert sh.run("echo $X").output == "41\n"  # `exit` ends one command, not the session
        r = sh.run_independent(["bash", "-c", 'echo "$0|$1|$(pwd)|$X"; echo err >&2', "--", "a b"])
        assert (r.output, r.exit_code) == ("--|a b|/root|\n", 0)  # outside the shell's state, stdout only
        assert sh.run_independent(["bash", "-c", "echo err >&2"], stderr=True).output == "err\n"
        assert sh.run("useradd bob && id -u bob").output == "1000\n"
        assert sh.run("echo x > /usr/lib/zz").exit_code != 0  # the system image is read-only
        assert sh.run("chmod u+s /usr/bin/find && stat -c %A /usr/bin/find").output == "-rwsr-xr-x\n"  # a copy
        r = sh.run("mkdir /working && echo x > /usr/stock.log && echo x > /usr/local/bin/t && echo x > /var/log/a && echo ok")
        assert r.output == "ok\n"  # where AgentBench's samples write
    finally:
        sh.close()
    with pytest.raises(RuntimeError, match="closed"):
        sh.run("true")


def test_nothing_of_the_host_is_visible(needs_sandbox: None, tmp_path: Path) -> None:
    secret = Path("/etc") / f"agentrl-secret-{os.getpid()}"
    secret.write_text("TOP-SECRET-7731")
    os.chmod(secret, 0o600)
    host_tmp = Path("/tmp") / f"agentrl-secret-{os.getpid()}"
    host_tmp.write_text("TOP-SECRET-7731")
    repo = Path(__file__).resolve().parents[2]
    sh = Shell(fast())
    try:
        for path in (secret, host_tmp, repo / "pyproject.toml"):
            r = sh.run(f"cat {path}")
            assert "TOP-SECRET" not in r.output and "No such file" in r.output and r.exit_code != 0, path
        assert sh.run("grep -rs TOP-SECRET-7731 / --exclude-dir=proc --exclude-dir=sys | head -1").output == ""
        assert sh.run("cat /etc/hostname; grep -c . /etc/passwd").output == "agentrl-sandbox\n18\n"  # the image's
        assert sh.run("cat /etc/debian_version").output.startswith("12.")
        ps = sh.run("ps -eo pid,args").output
        assert "/work" not in ps and "/tmp/" not in ps and str(repo) not in ps and "pytest" not in ps, ps
        assert ps.splitlines()[1].split()[:2] == ["1", "/usr/bin/python3"]  # the driver is PID 1
        r = sh.run("ls -l /proc/1/fd/1; cat /proc/1/environ; echo forged > /proc/1/fd/1")
        for denied in ("cannot read symbolic link '/proc/1/fd/1': Permission denied",
                       "/proc/1/environ: Permission denied", "/proc/1/fd/1: Permission denied"):
            assert denied in r.output, r.output  # the driver's channel is out of reach
    finally:
        sh.close()
        secret.unlink()
        host_tmp.unlink()


def test_graders_run_the_images_tools_whatever_the_session_did(needs_sandbox: None) -> None:
    """The session's root may change its own /usr/bin (as in AgentBench's container) but not what a grader
    runs: the layout that decides which code runs (/usr, /etc, the loader's /lib64, pinned /etc files) is
    made of mount points, which cannot be moved, a grader's /usr is a read-only view of the image (its
    /usr/bin and /usr/sbin the image's, new names included: they are not there) and /bin is a link to it
    again before a grader starts (a chmod alone shows: AgentBench's test-50 reads /usr/bin/find's mode)."""
    sh = Shell(fast(timeout=10.0))
    try:
        r = sh.run("cd /; for p in /usr /etc /lib64 /etc/ld.so.preload; do mv $p /moved 2>&1 | grep -c busy; done")
        assert r.output.split() == ["1", "1", "1", "1"], r.output
        fake = "printf '#!/usr/bin/bash\\necho FAKE\\nexit 0\\n'"
        r = sh.run(f"cp /usr/bin/bash /root/bash; {fake} > /root/fake; chmod +x /root/fake; "
                   "for t in grep wc python3.11 sh; do rm -f /usr/bin/$t; cp /root/fake /usr/bin/$t; done; "
                   "cp /root/fake /usr/sbin/ls; cp /root/fake /usr/bin/mytool; chmod u+s /usr/bin/find; "
                   "chmod 000 /usr/bin/wc; rm /usr/bin/tr && mkfifo /usr/bin/tr; "
                   "rm /bin && mkdir /bin && cp /root/fake /bin/bash && /usr/bin/grep x; echo $?")
        assert r.output == "FAKE\n0\n", r.output  # the session's own tools are the fakes now
        r = sh.run_independent(["bash", "-c", "echo abc | grep -c b; printf 'a\\nb\\n' | wc -l; /bin/sh -c 'echo sh'; "
                                "ls -d /root; stat -c %A /usr/bin/find; readlink /bin; command -v mytool; echo ab | tr a x"],
                               freeze=True)
        assert (r.exit_code, r.output) == (0, "1\n2\nsh\n/root\n-rwsr-xr-x\nusr/bin\nxb\n"), r.output
        r = sh.run_independent(["/usr/bin/python3", "-I", "-S", "-c", "print(6 * 7)"])
        assert (r.exit_code, r.output) == (0, "42\n")
        assert sh.run("command -v ls; mytool").output == "/usr/sbin/ls\nFAKE\n"  # the session's own stay its own
    finally:
        sh.close()


def test_the_sessions_usr_looks_like_the_graders(needs_sandbox: None) -> None:
    """On 639fcf2 `du -sh /usr` said 251M in the agent's shell and 205M to a grader (the session's copies of
    /usr/bin and /usr/sbin beside the image's hard links of them under /usr/lib/agentrl, and without
    perl's hard link), and `ls -lt /usr` put `local` first for a grader (its /usr/local made afresh):
    AgentBench's test-42 and test-19 failed their gold replay. Now the shell and a grader agree on what
    /usr takes (up to the image's directory blocks: a tmpfs directory takes none) and on its entries'
    order and times."""
    sh = Shell(fast(timeout=10.0))
    try:
        init = 'for i in $(seq 1 99); do echo "$i" > "/usr/$(( (i+50)%100 )).log"; done; echo s > /usr/OSbench'
        assert sh.run_independent(["bash", "-c", init], view=False).exit_code == 0
        probe = ("du -s -B1 /usr | cut -f1; ls -lt --time-style=+%s.%N /usr | awk 'NR>1 {print $6, $7}'; "
                 "stat -c '%n %Y %s' /usr /usr/local /usr/local/lib /usr/bin/perl; ls /usr/lib | grep -c agentrl")
        mine = sh.run(probe).output.splitlines()
        theirs = sh.run_independent(["bash", "-c", probe], freeze=True).output.splitlines()
        assert 0 <= int(theirs[0]) - int(mine[0]) <= 64 << 10, (mine[0], theirs[0])
        assert mine[1:] == theirs[1:] and len(mine) > 100, [(a, b) for a, b in zip(mine, theirs) if a != b][:5]
    finally:
        sh.close()


# Start-up files of the image's python3 that the session can write: a pyvenv.cfg beside the
# executable or one directory up whose `home` points at the agent's stdlib (read even under -I -S), and a
# `._pth` beside it that replaces sys.path. Each makes the session's own python3 run the agent's code.
PYVENV_PLANT = ("mkdir -p /tmp/e/bin /tmp/e/lib/python3.11/encodings && touch /tmp/e/lib/python3.11/os.py && "
                "echo 'import posix; posix._exit(0)' > /tmp/e/lib/python3.11/encodings/__init__.py && "
                "printf 'home = /tmp/e/bin\\n' > /usr/pyvenv.cfg; cp /usr/pyvenv.cfg /usr/bin/pyvenv.cfg; "
                "printf '/tmp/e/lib/python3.11\\n' > /usr/bin/python3.11._pth; "
                "/usr/bin/python3 -I -S -c 'import sys; sys.exit(1)'; echo $?")


def test_graders_python_ignores_start_up_files_the_session_wrote(needs_sandbox: None) -> None:
    """On c07c523 a grader's `python3 -I -S` read /usr/pyvenv.cfg and exited 0 for any script."""
    sh = Shell(fast(timeout=10.0))
    try:
        assert sh.run(PYVENV_PLANT).output == "0\n"  # the session's python3 runs the agent's `encodings`
        r = sh.run_independent(sb.python_argv("import sys; sys.exit(3)", []), freeze=True)
        assert r.exit_code == 3, r
        r = sh.run_independent(["bash", "-c", "python3 -c 'print(6 * 7)'; ls /usr | grep -c pyvenv"], freeze=True)
        assert (r.exit_code, r.output) == (1, "42\n0\n"), r  # grep -c found none: exit 1
        assert sh.run("ls /usr/pyvenv.cfg").output == "/usr/pyvenv.cfg\n"  # the session's file is untouched
    finally:
        sh.close()


def test_a_site_directory_moved_aside_runs_nothing_in_a_grader(needs_sandbox: None) -> None:
    """/usr/local can be renamed with its read-only lib inside, and a new
    /usr/local/lib/python3.11/dist-packages/*.pth then ran in every `python3` a bash check started (on
    c07c523 too). A grader's /usr/local/lib is the image's (empty) one."""
    sh = Shell(fast(timeout=10.0))
    try:
        plant = ("mv /usr/local /usr/local2 && mkdir -p /usr/local/lib/python3.11/dist-packages /usr/local/bin && "
                 "echo 'import os; os._exit(0)' > /usr/local/lib/python3.11/dist-packages/a.pth && "
                 "printf '#!/bin/sh\\necho mine\\n' > /usr/local/bin/mine && chmod +x /usr/local/bin/mine && "
                 "python3 -c 'import sys; sys.exit(3)'; echo $?")
        assert sh.run(plant).output == "0\n"  # the session's own python3 runs the .pth
        r = sh.run_independent(["bash", "-c", "python3 -c 'import sys; sys.exit(3)'; echo $?; mine"], freeze=True)
        assert r.output == "3\nmine\n", r  # the session's /usr/local/bin is still there for checks
    finally:
        sh.close()


def test_a_shared_mapping_of_a_tool_changes_nothing_a_grader_runs(needs_sandbox: None) -> None:
    """On c07c523 the restore skipped a tool whose (inode, ctime) had not changed since its last look: a
    process that dirtied a shared mapping of /usr/bin/grep before that look (same bytes: kept) rewrites
    it afterwards without a new page fault, so without a new ctime, and the next grader ran the agent's
    bytes. Graders now run the image's own tools: nothing is restored, no metadata is trusted."""
    sh = Shell(fast(timeout=10.0))
    try:
        mapper = ("import mmap, os, time\nf = open('/usr/bin/grep', 'r+b')\nm = mmap.mmap(f.fileno(), 0)\n"
                  "m[:1] = m[:1]\nopen('/root/mapped', 'w').close()\n"
                  "while not os.path.exists('/root/go'): time.sleep(0.02)\n"
                  "m[:40] = b'#!/bin/sh\\necho PWNED; exit 0\\n'.ljust(40, b'#')\nm.close()\nf.close()\n"
                  "open('/root/done', 'w').close()\ntime.sleep(600)\n")
        sh.run(f"cat > /root/m.py <<'EOF'\n{mapper}EOF\n")
        r = sh.run("python3 /root/m.py >/dev/null 2>&1 & while [ ! -e /root/mapped ]; do sleep 0.05; done; echo mapped")
        assert r.output == "mapped\n"
        assert sh.run_independent(["true"], freeze=True).exit_code == 0  # the last look (c07c523: a restore)
        r = sh.run("stat -c %i.%Z /usr/bin/grep; touch /root/go; while [ ! -e /root/done ]; do sleep 0.05; done; "
                   "stat -c %i.%Z /usr/bin/grep; grep x /dev/null")
        first, second, out = r.output.splitlines()
        assert first == second and out == "PWNED", r.output  # rewritten, same inode and ctime
        r = sh.run_independent(["bash", "-c", "echo abc | grep -c b"], freeze=True)
        assert (r.exit_code, r.output) == (0, "1\n"), r
    finally:
        sh.close()


def test_a_session_cgroup_bounds_what_all_its_processes_hold(needs_sandbox: None) -> None:
    """On c07c523 nothing bounded the sum of a session's processes (each under RLIMIT_AS).
    Now a cgroup per session does; the kernel kills the agent's processes first (oom_score_adj 1000,
    which they cannot lower), so the session itself lives on."""
    from agentrl.sandbox import cgroup_support

    if cgroup_support().kind is None:
        pytest.skip(f"this worker may not make cgroups: {cgroup_support().reason}")
    sh = Shell(fast(timeout=20.0, session_memory_mb=384, disk_mb=64))
    try:
        assert sh.cgroup is not None and all(d.is_dir() for d in sh.cgroup.dirs)
        r = sh.run("echo -1000 > /proc/self/oom_score_adj; cat /proc/self/oom_score_adj")
        assert r.output.endswith("1000\n"), r.output
        hog = "python3 -c 'x = b\"x\" * (200 << 20); import time; time.sleep(60)'"
        r = sh.run(f"for i in 1 2 3; do ({hog} &); done; sleep 3; pgrep -c python3")
        assert int(r.output.split()[-1]) < 3, r.output  # three of 200 MB each do not fit in 384 MB
        assert sh.run("echo alive").output == "alive\n"
        assert sh.run_independent(["bash", "-c", "cat /proc/self/oom_score_adj"], freeze=True).output == "500\n"
        dirs = sh.cgroup.dirs
    finally:
        sh.close()
    assert not any(d.exists() for d in dirs)  # removed with the session


def test_session_cannot_reach_the_network(needs_sandbox: None) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    sh = Shell(fast())
    try:
        code = (f"import socket\ns = socket.socket()\ns.settimeout(2)\ntry:\n    s.connect(('127.0.0.1', {port}))\n"
                "    print('connected')\nexcept OSError as e:\n    print('refused', type(e).__name__)")
        r = sh.run(f"python3 -c \"{code}\"")
        assert r.output.startswith("refused"), r.output
        assert sh.run("cat /proc/net/dev | grep -c ':'").output == "1\n"  # only a loopback of its own
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever arrived on the host's port
    finally:
        sh.close()
        server.close()


def test_disk_is_bounded(needs_sandbox: None) -> None:
    sh = Shell(fast(disk_mb=32, shm_mb=4, timeout=10.0))
    try:
        for where in ("/root", "/usr", "/etc", "/usr/bin"):  # the root, and mounts of their own
            r = sh.run(f"head -c 48M /dev/zero > {where}/big; echo rc=$?; du -m {where}/big | cut -f1; rm {where}/big")
            assert "No space left on device" in r.output and "rc=1" in r.output, where
            assert int(r.output.split()[-1]) <= (32 if where != "/usr/bin" else 40), where  # /usr/bin: the room
            # left beside its copies is `disk_mb` plus a page per entry of the estimate
        r = sh.run("rm /root/big; head -c 8M /dev/zero > /dev/shm/big; echo rc=$?; touch /dev/x")
        assert "No space left on device" in r.output and "rc=1" in r.output and "Read-only file system" in r.output
        assert sh.run("df -m / | tail -1 | awk '{print $2}'").output == "32\n"
    finally:
        sh.close()


def test_a_limit_that_cannot_be_set_fails_the_start(needs_sandbox: None, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(SandboxError, match="could not set the nofile limit"):
        Shell(fast(open_files=1 << 40))  # above the kernel's nr_open: setrlimit refuses
    # refused by the driver, or (a root worker raising its hard limit) by the launcher first
    assert any("refused to start" in r.message or "could not set the nofile limit" in r.message
               for r in caplog.records)


def many_uids() -> None:
    if not SandboxConfig().many_uids("bwrap"):
        pytest.skip("a range of user ids is mapped only for a root worker (this one is not root)")


def test_root_worker_maps_many_uids_with_dockers_capabilities(needs_sandbox: None) -> None:
    many_uids()
    sh = Shell(fast(timeout=10.0))
    try:
        r = sh.run("cat /proc/self/uid_map; grep -E 'Cap(Eff|Bnd)' /proc/self/status")
        assert r.output.split() == ["0", "0", "65536", "CapEff:", "00000000a80425fb", "CapBnd:", "00000000a80425fb"]
        # AgentBench's test-47: another user owns a file root then reads and runs (Docker's root can)
        r = sh.run("useradd -m -s /bin/bash jack && cd /home/jack && echo 'echo a3b0c7' > test && chmod 000 test "
                   "&& chown jack test && stat -c '%U %a' test && chmod 777 test && ./test && "
                   "runuser -l jack -c 'id -un; grep CapEff /proc/self/status'")
        assert r.output == "jack 0\na3b0c7\njack\nCapEff:\t0000000000000000\n", r.output
        # still no way to undo a mount or to make another user namespace
        r = sh.run("umount /usr/lib; echo $?; unshare -U true; echo $?; touch /usr/lib/x; echo $?")
        assert r.output.splitlines()[1::2] == ["32", "1", "1"], r.output
        assert "No space left on device" in r.output and "Read-only file system" in r.output
    finally:
        sh.close()


def test_fork_bomb_over_many_uids_stays_within_the_session_limit(needs_sandbox: None) -> None:
    many_uids()
    sh = Shell(fast(timeout=3.0, nproc=24))
    try:
        # each uid has a count of its own, but the kernel charges all of them to the launcher's namespace
        sh.run("for u in 1001 1002 1003 1004; do setpriv --reuid=$u --regid=$u --clear-groups "
               "bash -c 'for i in $(seq 40); do sleep 30 & done' >/dev/null 2>&1 & done; sleep 1")
        ns = sandbox_namespace(sh)
        n = processes_in(ns)
        assert 12 < n <= 26, n  # 4 uids x 40 asked for; one session's 24 (+ driver, bwrap) granted
        sh.close()
        deadline = time.monotonic() + 10
        while processes_in(ns) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_in(ns) == 0
    finally:
        sh.close()


def test_background_output_stays_out_of_later_commands(needs_sandbox: None) -> None:
    sh = Shell(fast())
    try:
        assert sh.run("(sleep 0.05; for i in 1 2 3 4 5; do echo LATE$i; sleep 0.1; done) & echo now").output == "now\n"
        outputs = [sh.run("sleep 0.15; echo after").output for _ in range(4)]
        assert outputs == ["after\n"] * 4
        assert sh.run("sleep 0.3; jobs -p | wc -l; pgrep -c sleep || true").exit_code == 0
    finally:
        sh.close()


def sandbox_namespace(sh: Shell) -> str:
    """The PID namespace of `sh`'s sandbox: that of the first descendant of the process `Shell` started
    (bwrap, or the launcher that makes its user namespaces) whose PID namespace is not the host's."""
    host = os.readlink("/proc/self/ns/pid")
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                status = (entry / "status").read_text()
                parents[int(entry.name)] = int(status.split("\nPPid:\t", 1)[1].split("\n", 1)[0])
        except (OSError, IndexError, ValueError):
            continue
    ours = {sh._proc.pid}  # type: ignore[union-attr]
    for _ in range(5):
        ours |= {pid for pid, ppid in parents.items() if ppid in ours}
    for pid in sorted(ours):
        try:
            ns = os.readlink(f"/proc/{pid}/ns/pid")
        except OSError:
            continue
        if ns != host:
            return ns
    raise AssertionError("no sandbox driver found")


def processes_in(ns: str) -> int:
    """Processes in a PID namespace, counted from the host (inside, a full process table leaves no
    process to count with)."""
    n = 0
    for entry in Path("/proc").iterdir():
        try:
            n += entry.name.isdigit() and os.readlink(entry / "ns/pid") == ns
        except OSError:
            continue
    return n


def test_fork_bomb_and_endless_loop_are_stopped_without_hurting_others(needs_sandbox: None) -> None:
    # Safe on a shared machine: a root worker's sandboxes run as an unprivileged uid, under RLIMIT_NPROC.
    assert os.geteuid() != 0 or SandboxConfig().host_uid != 0
    bomb = Shell(fast(timeout=2.0, nproc=32))
    loop = Shell(fast(timeout=1.5))
    calm = Shell(fast())
    looped: list[sb.CommandResult] = []
    try:
        bomb.run("( :(){ :|:& };: ) >/dev/null 2>&1 &")  # returns at once; the bomb grows meanwhile
        thread = threading.Thread(target=lambda: looped.append(loop.run("while true; do :; done")))
        thread.start()
        time.sleep(1.0)
        ns = sandbox_namespace(bomb)
        n = processes_in(ns)
        assert 20 < n <= 34, n  # the bomb filled its own sandbox's process limit, and no more
        # Meanwhile another session works normally (generous timeouts: no CPU quota without cgroups).
        for i in range(5):
            r = calm.run(f"echo {i} $(ls / | wc -l)", timeout=15.0)
            assert r.exit_code == 0 and r.output.startswith(f"{i} "), r
        thread.join(15)
        assert looped and looped[0].timed_out and looped[0].exit_code is None
        assert loop.run("echo back", timeout=15.0).output == "back\n"  # the session lives on
        bomb.close()  # ends every process of the sandbox
        deadline = time.monotonic() + 10
        while processes_in(ns) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_in(ns) == 0
        assert calm.run("echo still fine", timeout=15.0).output == "still fine\n"
    finally:
        for sh in (bomb, loop, calm):
            sh.close()


def test_timeout_stops_the_command_and_keeps_the_session(needs_sandbox: None) -> None:
    sh = Shell(fast(timeout=1.0))
    try:
        sh.run("cd /tmp; Y=5; sleep 300 & echo $! > /root/bg")
        r = sh.run("echo partial; sleep 30 & sleep 30")
        assert (r.output, r.timed_out, r.exit_code) == ("partial\n", True, None)
        assert sh.run("echo $Y $(pwd); pgrep -c sleep").output == "5 /tmp\n1\n"  # the earlier job lives on
    finally:
        sh.close()


def test_output_is_capped_and_close_kills_everything(needs_sandbox: None) -> None:
    sh = Shell(fast(timeout=5.0, max_output_bytes=10_000))
    try:
        r = sh.run("head -c 300000 /dev/zero | tr '\\0' y; echo; echo done")
        assert r.exit_code == 0 and r.truncated and len(r.output) == 10_000 and set(r.output) == {"y"}
        sh.run("sleep 300 &")
        pid = sh._proc.pid  # type: ignore[union-attr]
    finally:
        sh.close()
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_container_definitions() -> None:
    root = Path(__file__).resolve().parents[2] / "containers"
    sandbox = (root / "os-sandbox.def").read_text()
    assert "Bootstrap: docker" in sandbox and "From: ubuntu" in sandbox
    for pkg in ("python3", "passwd", "procps", "findutils"):  # what AgentBench's init/check scripts call
        assert f" {pkg} " in sandbox, pkg
    worker = (root / "agentrl.def").read_text()
    assert "bubblewrap" in worker and "mariadb-server" in worker and "data /opt/agentrl/data" in worker
