"""The session's own view of the host-wide files of /proc and of `sysinfo(2)`, LXCFS-like.

Like `driver.py`, this runs inside each `os` sandbox (bubblewrap), not in the worker: `agentrl.sandbox.shell`
sends its source and the boot code makes it the module `sandbox_proc`, which the driver imports. Standard
library and Python 3.9 only.

Why: /proc/meminfo, /proc/stat, /proc/loadavg, /proc/uptime, /proc/vmstat and `sysinfo(2)` are the host's:
their free memory, fork count, running and total thread counts, CPU and idle times move with every other
session's work, so one session modulates them and another reads the bits (a channel between sessions,
and a view of the host). bubblewrap hides every other host-wide file (`layout.proc_masks`); these six are
what `free`, `ps`, `top`, `uptime`, `vmstat` and glibc (`get_nprocs`, `sysconf(_SC_PHYS_PAGES)`) read, so
they are not hidden but made the session's own (`ProcView`):

  * memory: the session's cgroup (its limit is MemTotal, its usage and page cache the rest), read through
    descriptors the worker opened for the driver; without a cgroup, the resident memory of the session's
    processes and what its tmpfs mounts hold;
  * processes and CPU: the session's own processes (its PID namespace), their CPU times and those of the
    ones the driver reaped; idle is the rest of the session's CPUs since it started; load averages are the
    session's running count, averaged as the kernel does;
  * time: the host's boot time and uptime (`ps` computes each process's start and elapsed time from
    them and the per-process start ticks, which are the host's; neither moves with another session).

The files are written by the driver (PID 1) at most every `REFRESH_S` and before each command, into
files of a tmpfs it mounted, bound read-only over /proc's, whose tmpfs is then detached: no session
process can write them (a read-only bind mount, and no CAP_SYS_ADMIN to change it) or reach them by
another path. `sysinfo(2)` is answered from the same numbers by the driver through a seccomp listener
(`SECCOMP_RET_USER_NOTIF`): the calling process waits while the driver writes the answer into it.

Not here: timing (a session that runs CPU-bound work slows its neighbours, who can time it; per-session
CPU shares are not set), and host-wide identifiers the kernel allocates (pipe and socket inode numbers,
mount ids): docs/tasks.md lists what stays open.
"""
import ctypes
import math
import os
import resource
import struct
import time

REFRESH_S = 1.0
PROC_FILES = ("/proc/meminfo", "/proc/stat", "/proc/loadavg", "/proc/uptime", "/proc/vmstat", "/proc/swaps")
STATIC = {"/proc/sys/kernel/random/entropy_avail": "256\n"}
"""Host-wide values that tools may read, made neutral (the kernel's constant since 5.18)."""
PAGE = os.sysconf("SC_PAGE_SIZE")
HZ = os.sysconf("SC_CLK_TCK")
LOAD_DECAY = tuple(math.exp(-REFRESH_S / s) for s in (60.0, 300.0, 900.0))

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MNT_DETACH = 2


def _mount(libc, source, target, fstype, flags, data=None):
    args = [None if a is None else a.encode() for a in (source, target, fstype)]
    if libc.mount(args[0], args[1], args[2], ctypes.c_ulong(flags), None if data is None else data.encode()) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def _read_fd(fd):
    try:
        return os.pread(fd, 1 << 16, 0).decode()
    except OSError:
        return ""


def _stat_fields(text):
    """{key: int} of a `key value` file (memory.stat)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


class Sample:
    """One look at the session: memory (bytes), processes, CPU ticks."""

    def __init__(self):
        self.total = self.used = self.cache = self.shmem = self.anon = 0
        self.tasks = self.running = self.blocked = 0
        self.user = self.system = 0  # ticks
        self.last_pid = 0


class ProcView:
    """The session's /proc files and sysinfo answers (module docstring).

    cfg: {"memory": the session's memory limit in bytes, "usage": fd of its cgroup's usage file (or None),
    "stat": fd of its memory.stat (or None), "cpus": CPUs the session may run on}.
    """

    def __init__(self, cfg):
        self.limit = int(cfg.get("memory") or 0)
        self.usage_fd, self.stat_fd = cfg.get("usage"), cfg.get("stat")
        self.cpus = max(1, int(cfg.get("cpus") or len(os.sched_getaffinity(0))))
        with open("/proc/self/stat", "rb") as f:  # the driver's start, in ticks since boot: the session's age
            self.started = int(f.read().rpartition(b")")[2].split()[19]) / HZ
        self.btime = int(round(time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)))
        self.loads = [0.0, 0.0, 0.0]
        self.fds = {}  # /proc path -> a writable descriptor of the file bound over it
        self.refreshed = -1.0
        self.listener = -1
        self.sample = Sample()

    # ---------------------------------------------------------------------------------- the files
    def mount(self):
        """Bind a file of the driver's own over each of `PROC_FILES` and `STATIC`, read-only (module docstring)."""
        libc = ctypes.CDLL(None, use_errno=True)
        stage = "/run/agentrl-proc"
        os.makedirs(stage, 0o700, exist_ok=True)
        _mount(libc, "tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0700,size=1m")
        try:
            for i, path in enumerate((*PROC_FILES, *STATIC)):
                if not os.path.exists(path):
                    continue
                name = f"{stage}/{i}"
                self.fds[path] = os.open(name, os.O_RDWR | os.O_CREAT, 0o444)
                if path in STATIC:
                    os.write(self.fds[path], STATIC[path].encode())
                _mount(libc, name, path, None, MS_BIND)
                _mount(libc, None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        finally:
            if libc.umount2(stage.encode(), MNT_DETACH) != 0:
                raise OSError(ctypes.get_errno(), f"umount {stage}")
            os.rmdir(stage)
        self.refresh(force=True)

    def refresh(self, force=False):
        """Rewrite the dynamic files when `REFRESH_S` has passed since the last time (or `force`)."""
        now = time.monotonic()
        if not force and now - self.refreshed < REFRESH_S:
            return
        if self.refreshed >= 0:
            steps = max(1, round((now - self.refreshed) / REFRESH_S))
            self.sample = self.look()
            for i, decay in enumerate(LOAD_DECAY):
                d = decay ** steps
                self.loads[i] = self.loads[i] * d + (self.sample.running + self.sample.blocked) * (1 - d)
        else:
            self.sample = self.look()
        self.refreshed = now
        for path, text in self.render(self.sample).items():
            fd = self.fds.get(path)
            if fd is not None:
                data = text.encode()
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))

    def look(self):
        s = Sample()
        s.total = self.limit
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = resource.getrusage(resource.RUSAGE_SELF)
        user, system = children.ru_utime + own.ru_utime, children.ru_stime + own.ru_stime
        rss = 0
        me = os.getpid()
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
            except OSError:
                continue
            state = fields[0]
            threads = int(fields[17])
            s.tasks += threads
            s.running += state == b"R"
            s.blocked += state == b"D"
            if int(name) != me:  # the driver's own times are its rusage; the rest: own and reaped children
                user += (int(fields[11]) + int(fields[13])) / HZ
                system += (int(fields[12]) + int(fields[14])) / HZ
            rss += int(fields[21]) * PAGE
        s.user, s.system = int(user * HZ), int(system * HZ)
        try:
            with open("/proc/sys/kernel/ns_last_pid") as f:
                s.last_pid = int(f.read())
        except (OSError, ValueError):
            pass
        usage = _read_fd(self.usage_fd) if self.usage_fd is not None else ""
        stat = _stat_fields(_read_fd(self.stat_fd)) if self.stat_fd is not None else {}
        if usage.strip().isdigit():
            s.used = int(usage)
            s.cache = stat.get("file", stat.get("total_cache", stat.get("cache", 0)))
            s.shmem = stat.get("shmem", stat.get("total_shmem", 0))
            s.anon = stat.get("anon", stat.get("total_rss", stat.get("rss", 0)))
        else:  # no cgroup: the processes' resident memory and what the session's tmpfs mounts hold
            s.shmem = tmpfs_used()
            s.anon = rss
            s.cache = s.shmem
            s.used = rss + s.shmem
        if s.total <= 0:
            s.total = max(s.used, 1)
        s.used = min(s.used, s.total)
        return s

    def render(self, s):
        """The text of each of `PROC_FILES` for sample `s`."""
        kb = 1024
        free = max(s.total - s.used, 0)
        available = min(s.total, free + max(s.cache - s.shmem, 0))
        mem = [("MemTotal", s.total), ("MemFree", free), ("MemAvailable", available), ("Buffers", 0),
               ("Cached", s.cache), ("SwapCached", 0), ("Active", s.anon), ("Inactive", s.cache),
               ("Active(anon)", s.anon), ("Inactive(anon)", 0), ("Active(file)", 0), ("Inactive(file)", s.cache),
               ("Unevictable", 0), ("Mlocked", 0), ("SwapTotal", 0), ("SwapFree", 0), ("Dirty", 0),
               ("Writeback", 0), ("AnonPages", s.anon), ("Mapped", 0), ("Shmem", s.shmem), ("KReclaimable", 0),
               ("Slab", 0), ("SReclaimable", 0), ("SUnreclaim", 0), ("KernelStack", 0), ("PageTables", 0),
               ("CommitLimit", s.total), ("Committed_AS", s.used), ("VmallocTotal", 0), ("VmallocUsed", 0),
               ("HugePages_Total", None), ("HugePages_Free", None), ("Hugepagesize", 2048 * kb)]
        meminfo = "".join(f"{k + ':':<16}{0:>8}\n" if v is None else f"{k + ':':<16}{v // kb:>8} kB\n"
                          for k, v in mem)
        uptime = time.clock_gettime(time.CLOCK_BOOTTIME)
        age = uptime - self.started
        busy = s.user + s.system
        idle = max(int(age * HZ * self.cpus) - busy, 0)

        def cpu(name, share):
            return (f"{name} {s.user // share} 0 {s.system // share} {idle // share} 0 0 0 0 0 0\n")

        stat = cpu("cpu ", 1) + "".join(cpu(f"cpu{i}", self.cpus) for i in range(self.cpus))
        stat += (f"intr 0\nctxt 0\nbtime {self.btime}\nprocesses {s.last_pid}\nprocs_running {max(s.running, 1)}\n"
                 f"procs_blocked {s.blocked}\nsoftirq 0 0 0 0 0 0 0 0 0 0 0\n")
        vmstat = "".join(f"{k} {v}\n" for k, v in (
            ("nr_free_pages", free // PAGE), ("nr_inactive_anon", 0), ("nr_active_anon", s.anon // PAGE),
            ("nr_inactive_file", s.cache // PAGE), ("nr_active_file", 0), ("nr_shmem", s.shmem // PAGE),
            ("pgpgin", 0), ("pgpgout", 0), ("pswpin", 0), ("pswpout", 0), ("pgfault", 0), ("pgmajfault", 0)))
        return {
            "/proc/meminfo": meminfo,
            "/proc/stat": stat,
            "/proc/loadavg": " ".join(f"{x:.2f}" for x in self.loads)
            + f" {max(s.running, 1)}/{max(s.tasks, 1)} {s.last_pid}\n",
            "/proc/uptime": f"{uptime:.2f} {idle / HZ:.2f}\n",
            "/proc/vmstat": vmstat,
            "/proc/swaps": "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n",
        }

    # --------------------------------------------------------------------------------- sysinfo(2)
    def listen(self, machine):
        """Trap `sysinfo(2)` of this process and all it starts, to be answered by `answer` (module docstring)."""
        arch, nr_sysinfo, nr_seccomp = SYSINFO_ARCHES[machine]
        prog = b"".join(struct.pack("=HBBI", *insn) for insn in (
            (0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, 0x7FFF0000),  # another arch: allowed (bwrap's filter)
            (0x20, 0, 0, 0), (0x15, 0, 1, nr_sysinfo), (0x06, 0, 0, 0x7FC00000),  # SECCOMP_RET_USER_NOTIF
            (0x06, 0, 0, 0x7FFF0000)))
        buf = ctypes.create_string_buffer(prog)
        fprog = SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        fd = libc.syscall(ctypes.c_long(nr_seccomp), ctypes.c_long(1), ctypes.c_long(8), ctypes.byref(fprog))
        if fd < 0:  # SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER
            raise OSError(ctypes.get_errno(), "seccomp listener for sysinfo")
        self.listener = fd
        self._libc = libc
        return fd

    def answer(self):
        """Answer one trapped sysinfo(2) with the session's numbers (the listener is readable)."""
        libc = self._libc
        notif = Notif()
        if libc.ioctl(self.listener, ctypes.c_ulong(NOTIF_RECV), ctypes.byref(notif)) != 0:
            return  # the caller died meanwhile
        self.refresh()
        s = self.sample
        info = SysInfo()
        info.uptime = int(time.clock_gettime(time.CLOCK_BOOTTIME))
        for i, load in enumerate(self.loads):
            info.loads[i] = int(load * 65536)
        info.totalram, info.freeram, info.sharedram = s.total, max(s.total - s.used, 0), s.shmem
        info.procs = min(max(s.tasks, 1), 65535)
        info.mem_unit = 1
        resp = Resp(notif.id, 0, 0, 0)
        local = IoVec(ctypes.cast(ctypes.byref(info), ctypes.c_void_p), ctypes.sizeof(info))
        remote = IoVec(ctypes.c_void_p(notif.data.args[0]), ctypes.sizeof(info))
        valid = ctypes.c_uint64(notif.id)
        if libc.ioctl(self.listener, ctypes.c_ulong(NOTIF_ID_VALID), ctypes.byref(valid)) != 0:
            return
        if libc.process_vm_writev(notif.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) != ctypes.sizeof(info):
            resp.val, resp.error = -1, -14  # EFAULT, as the kernel answers a bad buffer
        libc.ioctl(self.listener, ctypes.c_ulong(NOTIF_SEND), ctypes.byref(resp))


def tmpfs_used():
    """Bytes the session's tmpfs mounts hold (its root, /etc, /usr, /dev/shm, ...)."""
    total, seen = 0, set()
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split()[:1] != ["tmpfs"]:
            continue
        dev, point = left.split()[2], left.split()[4]
        if dev in seen:
            continue
        seen.add(dev)
        try:
            st = os.statvfs(point)
        except OSError:
            continue
        total += (st.f_blocks - st.f_bfree) * st.f_frsize
    return total


SYSINFO_ARCHES = {"x86_64": (0xC000003E, 99, 317), "aarch64": (0xC00000B7, 179, 277)}
"""Per machine: the audit architecture and the numbers of sysinfo and seccomp."""
NOTIF_RECV, NOTIF_SEND, NOTIF_ID_VALID = 0xC0502100, 0xC0182101, 0x40082102


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class SeccompData(ctypes.Structure):
    _fields_ = [("nr", ctypes.c_int), ("arch", ctypes.c_uint32), ("ip", ctypes.c_uint64),
                ("args", ctypes.c_uint64 * 6)]


class Notif(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("data", SeccompData)]


class Resp(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32),
                ("flags", ctypes.c_uint32)]


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class SysInfo(ctypes.Structure):
    _fields_ = [("uptime", ctypes.c_long), ("loads", ctypes.c_ulong * 3), ("totalram", ctypes.c_ulong),
                ("freeram", ctypes.c_ulong), ("sharedram", ctypes.c_ulong), ("bufferram", ctypes.c_ulong),
                ("totalswap", ctypes.c_ulong), ("freeswap", ctypes.c_ulong), ("procs", ctypes.c_ushort),
                ("pad", ctypes.c_ushort), ("totalhigh", ctypes.c_ulong), ("freehigh", ctypes.c_ulong),
                ("mem_unit", ctypes.c_uint), ("_f", ctypes.c_char * 0)]
