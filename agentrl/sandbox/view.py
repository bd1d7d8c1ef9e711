"""The session's copies of the image's tools, and the read-only view of the image each grader runs in.

Like `driver.py`, this runs inside each `os` sandbox, not in the worker: `agentrl.sandbox.shell`
sends its source first, and the boot code makes it the module `sandbox_view`, which the driver imports.
Standard library and Python 3.9 only. `Tools` is made once at the sandbox's start (by the driver, PID 1,
which holds CAP_SYS_ADMIN of the sandbox's user namespace); `enter_view` runs in each grader's process
between fork and exec.
"""
import ctypes
import os
import shutil
import stat


class Tools:
    """The session's own copies of the image's tool directories, and the top-level links of its root.

    `dirs` (/usr/bin, /usr/sbin): bubblewrap binds the image's own, read-only; at start each gets a
    tmpfs mounted over it that holds a copy (hard links, symlinks, modes and times kept, so `du` and
    `ls -l` see what they see in the image): the session's to change as it likes (AgentBench's root may
    replace a tool). The image's directory stays underneath, where no session process can reach it (no
    mount can be undone without CAP_SYS_ADMIN); a grader's view takes the copy off (`enter_view`) and
    checks that what it finds is the directory recorded here (`covered`: device and inode). From the
    copies a view takes only the mode and owner of an image tool (`overrides`: test-50's check reads
    /usr/bin/find's mode), never bytes or names. `links`: top-level symlinks of the image that must point
    where they did (/bin -> usr/bin); `restore` puts them back before a grader (a link, unlike a
    directory, cannot be mounted over).
    """

    MAX_OVERRIDES = 32
    MAX_OVERRIDE_BYTES = 64 << 20

    def __init__(self, dirs, links, room):
        self.links = dict(links)
        self.dirs = list(dirs)
        self.covered = {}  # dir -> [st_dev, st_ino] of the image's directory under the session's copy
        self.fds = {}  # dir -> the image's directory, opened before it was covered (never inherited)
        self.initial = {}  # (dir, name) -> (inode, mode, uid, gid) of the copy as made: what "changed" is measured from
        libc = ctypes.CDLL(None, use_errno=True)
        for d in self.dirs:
            st = os.stat(d)
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            self.fds[d], self.covered[d] = fd, [st.st_dev, st.st_ino]
            image = f"/proc/self/fd/{fd}"
            _mount(libc, "tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0755,size={tree_bytes(image) + room}")
            copy_tree(image, d)
            os.chmod(d, stat.S_IMODE(st.st_mode))
            os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
            for name in os.listdir(fd):
                b = os.lstat(os.path.join(d, name))
                if stat.S_ISREG(b.st_mode):
                    self.initial[d, name] = (b.st_ino, stat.S_IMODE(b.st_mode), b.st_uid, b.st_gid)

    def restore(self):
        for path, target in self.links.items():
            if not (os.path.islink(path) and os.readlink(path) == target):
                remove(path)
                os.symlink(target, path)

    def overrides(self):
        """[dir, name, mode, uid, gid] of the image's tools whose session copy (the same file as made: a
        chmod or chown, not a replacement) has another mode or owner: the grader's view shows the image's
        bytes with the session's metadata. Only metadata is taken, so the inode trusted here decides
        nothing a grader runs."""
        out, total = [], 0
        for (d, name), (ino, *meta) in sorted(self.initial.items()):
            try:
                b = os.lstat(os.path.join(d, name))
            except OSError:
                continue
            # a chmod or chown of the copy as made (same inode); a replaced tool shows the image's own
            if b.st_ino != ino or meta == [stat.S_IMODE(b.st_mode), b.st_uid, b.st_gid]:
                continue
            total += os.stat(name, dir_fd=self.fds[d], follow_symlinks=False).st_size
            if len(out) == self.MAX_OVERRIDES or total > self.MAX_OVERRIDE_BYTES:
                return out
            out.append([d, name, stat.S_IMODE(b.st_mode), b.st_uid, b.st_gid])
        return out


def tree_bytes(root):
    """What a copy of the tree at `root` takes on a tmpfs: each file rounded up to pages, plus a page per entry."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            total += (os.lstat(os.path.join(dirpath, name)).st_size + 4095) // 4096 * 4096 + 4096
    return total


def copy_tree(src, dst):
    """Copy the tree at `src` into the existing directory `dst`: files with their mode and times, symlinks
    as symlinks, hard links as hard links (perl and perl5.36.0 are one file: `du` counts it once), and
    the directories' modes and times last (filling a directory changes its mtime)."""
    seen = {}  # (st_dev, st_ino) of a source file -> its copy
    dirs = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        out = dst if rel == "." else os.path.join(dst, rel)
        for name in dirnames:
            os.mkdir(os.path.join(out, name))
            dirs.append((os.path.join(dirpath, name), os.path.join(out, name)))
        for name in filenames:
            s, d = os.path.join(dirpath, name), os.path.join(out, name)
            st = os.lstat(s)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(s), d)
                os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
            elif (st.st_dev, st.st_ino) in seen:
                os.link(seen[st.st_dev, st.st_ino], d)
            else:
                shutil.copy2(s, d, follow_symlinks=False)
                seen[st.st_dev, st.st_ino] = d
    for s, d in reversed(dirs):
        shutil.copystat(s, d, follow_symlinks=False)


# ------------------------------------------------------------------------------- the grader's view

CLONE_NEWNS = 0x00020000
MNT_DETACH = 2
USR_STARTUP = ("pyvenv.cfg",)
"""Names directly in /usr that decide what code the image's programs run: CPython reads `pyvenv.cfg` one
directory above its executable (/usr/bin/python3 -> /usr), even under -I -S. (Its `._pth` and
`pybuilddir.txt` are read beside the executable, in /usr/bin: the image's own in a grader's view.)"""
MAX_OWN = 256  # the session's own names in /usr a grader's view shows (sorted; each one bind mount)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
RO_REMOUNT = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV


def _encoded(text):
    return None if text is None else text.encode()


def _mount(libc, source, target, fstype, flags, data=None):
    args = (_encoded(source), _encoded(target), _encoded(fstype), ctypes.c_ulong(flags), _encoded(data))
    if libc.mount(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def node_id(parent, name, parent_fd=None):
    """[st_dev, st_ino] of the directory `parent`/`name`, no symlink followed on the way (None: not there)."""
    fd = None
    try:
        fd = os.open(parent, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY) if parent_fd is None else parent_fd
        child = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=fd)
    except OSError:
        return None
    finally:
        if fd is not None and parent_fd is None:
            os.close(fd)
    st = os.fstat(child)
    os.close(child)
    return [st.st_dev, st.st_ino]


def _times(path):
    st = os.lstat(path)
    return st.st_atime_ns, st.st_mtime_ns


def enter_view(view, covered, overrides):
    """Give this (forked, not yet exec'd) process its own mount namespace whose /usr is the image's, read-only.

    The session's /usr is a tmpfs the session may write (a new /usr/pyvenv.cfg, /usr/bin/python3._pth,
    ... are start-up files of the image's python3), and its /usr/bin, /usr/sbin are its own copies,
    mounted over the image's (`Tools`). Here the copies come off first (`covered`: each directory
    beneath must be the image's one recorded at start, else no grader runs), then a fresh tmpfs covers
    /usr and holds bind mounts of the image's own directories (the read-only children of the session's
    /usr, bin and sbin among them), its symlinks, and what is the session's own: /usr/local (bound
    whole while its lib is still the image's read-only directory; else its children, not its lib: the
    image's empty one) and the names it made directly in /usr (data a check reads, e.g.
    /usr/stock.log), less `USR_STARTUP`; then the tmpfs is made read-only. The other paths (/etc with
    its pinned start-up files, /root, /home, /tmp, /var, /proc) stay the session's: they are what a
    check reads. Nothing the session wrote is on the grader's start-up path, and there is no copy to
    restore, so no metadata (inode, ctime) is trusted. What the view makes afresh (links, directories,
    /usr itself) gets the session's times, so `ls -lt /usr` orders it as the agent's shell does.

    `view`: {"ro": [names], "links": {name: target}, "local": bool, "local_lib": [the image's
    directories under /usr/local/lib, relative], "local_lib_id": `node_id` of /usr/local/lib at start}.
    `covered`: `Tools.covered`; `overrides`: `Tools.overrides`. Runs as the driver's child, which still
    holds CAP_SYS_ADMIN of the sandbox's user namespace; the program it then execs does not (it is in no
    bounding set).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    for d, ident in sorted(covered.items()):  # the session's copies off: the image's directories beneath
        if libc.umount2(d.encode(), MNT_DETACH) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"umount {d}: {os.strerror(errno)}")
        st = os.lstat(d)
        if [st.st_dev, st.st_ino] != list(ident):
            raise OSError(f"{d} beneath the session's copy is not the image's directory")
    sources = {name: f"/usr/{name}" for name in view.get("ro", [])}
    links = dict(view.get("links", {}))
    own = sorted(set(os.listdir("/usr")) - set(sources) - set(links) - set(USR_STARTUP) - {"local"})
    for name in own[:MAX_OWN]:  # what the session made in /usr (AgentBench's /usr/stock.log): its own, writable
        if os.path.islink(f"/usr/{name}"):
            links[name] = os.readlink(f"/usr/{name}")
        else:
            sources[name] = f"/usr/{name}"
    fds = {name: os.open(path, os.O_PATH | os.O_NOFOLLOW) for name, path in sources.items()}
    stamps = {"": _times("/usr")}  # what the view makes afresh -> the session's (atime, mtime)
    # /usr/local: the session's, but never a lib of its own (python's site directory there: a .pth in it
    # runs code in every `python3` a bash check starts, and the session can move the read-only one aside)
    local_names, whole = [], False
    if view.get("local"):
        try:
            local_fd = os.open("/usr/local", os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
        except OSError:
            local_fd = None
        if local_fd is not None:
            stamps["local"] = _times("/usr/local")
            lib = view.get("local_lib_id")
            whole = lib is not None and node_id(None, "lib", parent_fd=local_fd) == lib
            if whole:  # its lib is still the image's, read-only: the session's /usr/local as it sees it
                fds["local"] = local_fd
            else:
                os.close(local_fd)
                local_names = sorted(set(os.listdir("/usr/local")) - {"lib"})[:MAX_OWN]
    for name in local_names:
        if os.path.islink(f"/usr/local/{name}"):
            links[f"local/{name}"] = os.readlink(f"/usr/local/{name}")
        else:
            fds[f"local/{name}"] = os.open(f"/usr/local/{name}", os.O_PATH | os.O_NOFOLLOW)
    for name in links:
        if os.path.lexists(f"/usr/{name}"):
            stamps[name] = _times(f"/usr/{name}")
    image_names = set(view.get("ro", []))
    try:
        size = sum(os.stat(os.path.join(d, n)).st_size for d, n, *_ in overrides) + (4 << 20)
        _mount(libc, "tmpfs", "/usr", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0755,size={size}")
        if view.get("local") and not whole:
            for d in view.get("local_lib", [""]):  # the image's own /usr/local/lib: empty directories
                os.makedirs(os.path.join("/usr/local/lib", d), 0o755, exist_ok=True)
        for name, fd in fds.items():
            target = f"/usr/{name}"
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(target, 0o755, exist_ok=True)
            else:
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
            _mount(libc, f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
            if name in image_names:
                _mount(libc, None, target, None, RO_REMOUNT)
        for name, target in links.items():
            os.symlink(target, f"/usr/{name}")
        for i, (d, name, mode, uid, gid) in enumerate(overrides):
            stage, target = f"/usr/.agentrl-{i}", os.path.join(d, name)
            shutil.copyfile(target, stage)  # the view's (image) bytes
            os.chown(stage, uid, gid)
            os.chmod(stage, mode)
            os.utime(stage, ns=_times(target))
            _mount(libc, stage, target, None, MS_BIND)
            _mount(libc, None, target, None, RO_REMOUNT)
            os.unlink(stage)
        for name, ns in sorted(stamps.items(), key=lambda kv: -kv[0].count("/") - int(kv[0] != "")):
            if name == "local" and whole:
                continue  # the session's own directory, bound: its times are its own
            os.utime(os.path.join("/usr", name) if name else "/usr", ns=ns, follow_symlinks=False)
        _mount(libc, None, "/usr", None, RO_REMOUNT)
    finally:
        for fd in fds.values():
            os.close(fd)


def remove(path):
    """Remove whatever is at `path` (a file, a link, a directory tree; nothing is fine)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
