"""The state folder where GPU claims live, opened so that no other local user can
redirect, replace or read-modify what gpuenv writes there.

Threat: on a shared server any user can plant files and symbolic links in a folder all
users write to. So the folder is never created shared or chmod'ed by gpuenv: an admin
makes it once (root-owned, sticky, like /tmp). Every component of its path is opened
with O_NOFOLLOW from `/` and checked with fstat (owned by root or by us; writable by
others only when sticky); files in it are opened relative to the folder's descriptor
with O_NOFOLLOW, and made with O_EXCL. Without a shared folder, a private per-user one
is used: on a single-user machine nothing needs setting up.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import stat
import struct
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import platformdirs

from gpuenv.common.filelock import wait_for_lock
from gpuenv.errors import LockHeld, StateUnsafe, UsageError
from gpuenv.host.procfs import process_owner

STATE_ENV = "GPUENV_STATE_DIR"
SHARED_STATE_DIR = "/var/tmp/gpuenv"
LOCK_TIMEOUT_ENV = "GPUENV_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 10.0
LOCK_NAME = "claims.lock"
# An admin's marker (owned by the folder's owner): the folder is on storage several
# hosts mount, so claims written on other hosts count while their heartbeat is fresh.
HOSTS_MARKER = "shared-between-hosts"
CREATE_HINT = (
    f"an admin creates the shared folder once: `sudo install -d -m 1777 -o root {SHARED_STATE_DIR}`"
)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@dataclass
class Folder:
    """An open, validated state folder."""

    path: str
    fd: int
    owner: int
    shared: bool  # other users can add files (root-owned and sticky)
    between_hosts: bool  # the admin marked it as mounted on several hosts
    note: str = ""  # why the shared default was not used, if it exists but is unsafe

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def user_state_dir() -> str:
    """This user's own state folder (~/.local/state/gpuenv), where no shared one is set
    up; UsageError with the fix under a HOME that does not exist (never created)."""
    home = os.environ.get("HOME")
    if home and os.path.isabs(home) and not os.path.isdir(home):
        raise UsageError(
            f"HOME ({home}) does not exist, and gpuenv does not create it for its state "
            f"folder (no shared {SHARED_STATE_DIR} on this host)",
            hint=f"set {STATE_ENV} to a folder you can write; {CREATE_HINT}",
        )
    return platformdirs.user_state_dir("gpuenv")


def _unsafe(
    where: str, why: str, hint: str = CREATE_HINT, what: str = "the gpuenv state folder"
) -> StateUnsafe:
    return StateUnsafe(f"{what} is unsafe: {where} {why}", hint=hint)


def _check_component(
    where: str, info: os.stat_result, final: bool, what: str = "the gpuenv state folder"
) -> None:
    me = os.getuid()
    if info.st_uid not in (0, me):
        raise _unsafe(
            where,
            f"belongs to {owner_name(info.st_uid)} (uid {info.st_uid}), who could replace "
            "what gpuenv writes there",
            hint=f"use a folder owned by root or by you; {CREATE_HINT}",
            what=what,
        )
    writable_by_others = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable_by_others and not info.st_mode & stat.S_ISVTX:
        mode = stat.S_IMODE(info.st_mode)
        raise _unsafe(
            where,
            f"has mode {mode:o}: others can delete or rename files in it (it is not sticky)",
            hint=f"make it sticky (`sudo chmod +t {where}`); {CREATE_HINT}"
            if final
            else f"choose a state folder under safer folders; {CREATE_HINT}",
            what=what,
        )


def open_folder(
    path: str, *, create: bool, what: str = "the gpuenv state folder"
) -> tuple[int, os.stat_result]:
    """Open `path` component by component from `/` without following a symbolic link,
    checking each; missing components are made private (0700) when `create`. `what`
    names the folder in messages."""
    absolute = os.path.abspath(path)
    parts = [p for p in absolute.split("/") if p]
    fd = os.open("/", _DIR_FLAGS)
    where = ""
    try:
        info = os.fstat(fd)
        for index, name in enumerate(parts):
            where += "/" + name
            final = index == len(parts) - 1
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise UsageError(
                        f"cannot create the gpuenv state folder {absolute}: {exc.strerror}",
                        hint=f"set {STATE_ENV} to a folder you can write; {CREATE_HINT}",
                    ) from None
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    link = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    kind = "a symbolic link" if stat.S_ISLNK(link.st_mode) else "not a folder"
                    raise _unsafe(
                        where,
                        f"is {kind} (owned by {owner_name(link.st_uid)}): gpuenv never follows one",
                        hint=f"remove it (its owner or root), or set {STATE_ENV}; {CREATE_HINT}",
                        what=what,
                    ) from None
                raise UsageError(
                    f"cannot open {what} {absolute}: {exc.strerror} ({where})",
                    hint=f"set {STATE_ENV} to a folder you can use; {CREATE_HINT}",
                ) from None
            os.close(fd)
            fd = child
            info = os.fstat(fd)
            _check_component(where, info, final, what)
        if not _writable(info):
            raise UsageError(
                f"{what} {absolute} is not writable for you",
                hint=f"{CREATE_HINT}; or set {STATE_ENV} to a folder of your own",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _writable(info: os.stat_result) -> bool:
    """Whether we may add files to a folder, from its fstat (no path to race on)."""
    me = os.getuid()
    if me == 0:
        return True
    need = stat.S_IWOTH | stat.S_IXOTH
    if info.st_uid == me:
        need = stat.S_IWUSR | stat.S_IXUSR
    elif info.st_gid in (os.getgid(), *os.getgroups()):
        need = stat.S_IWGRP | stat.S_IXGRP
    return info.st_mode & need == need


def _between_hosts(fd: int, owner: int) -> bool:
    try:
        marker = os.open(HOSTS_MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return False
    try:
        info = os.fstat(marker)
    finally:
        os.close(marker)
    return stat.S_ISREG(info.st_mode) and info.st_uid == owner


def open_state(env: Mapping[str, str] | None = None, directory: str | None = None) -> Folder:
    """The state folder: `directory`, else GPUENV_STATE_DIR, else /var/tmp/gpuenv where an
    admin made it (and it is safe), else a private per-user folder."""
    env = os.environ if env is None else env
    explicit = directory or env.get(STATE_ENV)
    note = ""
    if explicit:
        fd, info = open_folder(explicit, create=True)
        path = os.path.abspath(explicit)
    else:
        try:
            fd, info = open_folder(SHARED_STATE_DIR, create=False)
            path = SHARED_STATE_DIR
        except FileNotFoundError:
            fd, info = open_folder(user_state_dir(), create=True)
            path = user_state_dir()
        except (StateUnsafe, UsageError) as exc:
            note = f"{SHARED_STATE_DIR} is not used: {exc.message}"
            fd, info = open_folder(user_state_dir(), create=True)
            path = user_state_dir()
    shared = bool(info.st_mode & stat.S_IWOTH)
    return Folder(path, fd, info.st_uid, shared, _between_hosts(fd, info.st_uid), note)


def lock_timeout(env: Mapping[str, str] | None = None) -> float:
    env = os.environ if env is None else env
    try:
        return max(0.0, float(env.get(LOCK_TIMEOUT_ENV) or DEFAULT_LOCK_TIMEOUT))
    except ValueError:
        raise UsageError(f"{LOCK_TIMEOUT_ENV}={env[LOCK_TIMEOUT_ENV]!r} is not seconds") from None


def _open_lock(folder: Folder) -> int:
    """The lock file, made with O_EXCL by whoever comes first (mode 0666: a POSIX write
    lock needs a descriptor open for writing); never through a link."""
    try:
        fd = os.open(
            LOCK_NAME,
            os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o666,
            dir_fd=folder.fd,
        )
    except FileExistsError:
        pass
    else:
        os.fchmod(fd, 0o666)  # the file we just made, through its descriptor (umask)
        return fd
    where = os.path.join(folder.path, LOCK_NAME)
    try:
        fd = os.open(
            LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder.fd
        )
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EACCES):
            raise UsageError(f"cannot open {where}: {exc.strerror}") from None
        link = os.stat(LOCK_NAME, dir_fd=folder.fd, follow_symlinks=False)
        what = (
            "is a symbolic link"
            if stat.S_ISLNK(link.st_mode)
            else f"is not writable for all (mode {stat.S_IMODE(link.st_mode):o})"
        )
        raise _unsafe(
            where,
            f"{what} (owned by {owner_name(link.st_uid)}): gpuenv cannot lock it safely",
            hint=f"its owner or root removes it (`rm {where}`); gpuenv makes it again",
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _unsafe(
            where, "is not a regular file", hint=f"its owner or root removes it: `rm {where}`"
        )
    return fd


# struct flock on Linux: short l_type, l_whence; off_t l_start, l_len; pid_t l_pid.
_FLOCK = "hhqqi4x"


def hold(fd: int) -> None:
    """Take an open-file-description write lock on our own new file: it lasts until the
    descriptor is closed or the process dies (however it dies), and unlike a POSIX lock
    survives this process opening and closing the file elsewhere."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))


def is_held(fd: int) -> bool:
    """Whether a live process holds a write lock on `fd`'s file. Asking about a read lock
    reports only write locks, which need the file open for writing: its owner's (or
    root's), not a lock anyone who can read it could take."""
    query = struct.pack(_FLOCK, fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, query)
    except OSError:
        return False
    return bool(struct.unpack(_FLOCK, answer)[0] == fcntl.F_WRLCK)


def lock_holder(fd: int) -> str:
    """Who holds the lock on `fd`'s file: F_GETLK names the pid of a POSIX lock's holder
    to any user (unlike flock, whose holders only /proc/locks lists, root-only on some
    kernels): 'pid N (user: command)'."""
    query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    try:
        kind, _, _, _, pid = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, query))
    except OSError:
        return "an unknown process"
    if kind == fcntl.F_UNLCK or pid <= 0:
        return "an unknown process (in another PID namespace?)"
    owner, command = process_owner(pid), _command(pid)
    if owner == "?":  # /proc is private on some hardened hosts
        return f"pid {pid} (its user and command are not visible here)"
    return f"pid {pid} ({owner}: {command})"


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode(errors="replace") for w in words if w)
    return "".join(ch if ch.isprintable() else " " for ch in text)[:120].strip() or "?"


@contextlib.contextmanager
def locked(folder: Folder, timeout: float) -> Iterator[None]:
    """The folder's one lock (a POSIX write lock on claims.lock: the kernel drops it if
    the holder dies), waited for at most `timeout` seconds; LockHeld names the holder.
    Whoever owns the lock file can delete it: after locking, the name must still be the
    locked file, else lock again. (A process holds the lock once: not for threads.)"""
    deadline = time.monotonic() + timeout
    while True:
        fd = _open_lock(folder)
        try:
            taken = wait_for_lock(fd, max(0.0, deadline - time.monotonic()), posix=True)
        except OSError:
            os.close(fd)
            raise
        if not taken:
            holder = lock_holder(fd)
            os.close(fd)
            where = os.path.join(folder.path, LOCK_NAME)
            raise LockHeld(
                f"{where} has been locked for over {timeout:g}s by {holder}",
                hint="retry in a moment; if that process is stuck, its owner or root "
                f"can stop it; {LOCK_TIMEOUT_ENV} sets how long gpuenv waits",
            )
        try:
            now = os.stat(LOCK_NAME, dir_fd=folder.fd, follow_symlinks=False)
            held = os.fstat(fd)
            same = (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        os.close(fd)


def state_dir(env: Mapping[str, str] | None = None) -> str:
    """The path of the state folder `open_state` chooses, checked the same way (for
    records kept beside the claims, such as GPU-hours)."""
    folder = open_state(env)
    folder.close()
    return folder.path
