"""dcgm-exporter's HPC job mapping, kept from gpuenv's claims: where a site runs the stock
dcgm-exporter with `--hpc-job-mapping-dir DIR`, gpuenv keeps one file per GPU in DIR
listing the runs that hold it, and the exporter adds `hpc_job="<run>"` to that GPU's
metrics (one series per run).

The format, as NVIDIA/dcgm-exporter reads it (internal/pkg/transformation/hpc.go,
`getGPUFiles`, `validGPUFile` and `readFile`, at commit
d5e5f510a1b6b393f39a43293ccd9dc985defc79; MIG names since 2623f7a, "Add MIG device
support for hpc labels"): every entry of DIR that is not a directory and whose name
matches `^\\d+(\\.\\d+)?$` is read, symbolic links included (followed by os.Open); the name
is the GPU's index (its DCGM GPU id) or, for a MIG instance, `<GPU index>.<GPU instance
id>`; each line is one job id, taken verbatim as the label value; a GPU without a file
keeps its metrics unlabelled; a file it cannot read (a dangling link, say) fails the
hpcMapper transformation, and with it the whole scrape (HTTP 500, server.go).

Trust: the files are written only by a process that owns the folder (or root), since
one file lists every user's runs: a folder others may write would let one user rewrite
another's lines. The folder is gpuenv's alone: every number-named entry gpuenv did not
write is removed or replaced. Each line comes from a live claim, whose user is its
file's owner (fstat), never what the claim says; which file it goes in comes from the
claim's GPU as this host lists it, never from the claim, and a file lists at most
MAX_LINES runs, so a user's claims cannot land in another GPU's file or grow one without
limit.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuenv.common.siteconfig import read_site_config
from gpuenv.errors import GpuenvError
from gpuenv.host.machine import Host
from gpuenv.reservations.statedir import open_folder


class ClaimView(Protocol):
    """What the mapping reads of a claim (`claims.Claim`, which imports this module)."""

    @property
    def gpu(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def host(self) -> str: ...
    @property
    def project(self) -> str: ...
    @property
    def container(self) -> str: ...


JOB_MAP_ENV = "GPUENV_JOB_MAPPING_DIR"
SITE_SECTION = "dcgm_exporter"
SITE_KEY = "job_mapping_dir"
# dcgm-exporter's validGPUFile (hpc.go): a GPU index, or GPU index "." GPU instance id.
SLOT = re.compile(r"\d+(\.\d+)?")
MAX_FILE = 64 * 1024
# Runs listed per GPU file: each is one more series of every metric of that GPU in
# dcgm-exporter. A GPU rarely has more holders than this (MIG instances have files of
# their own); past it, each user's first runs are listed before anyone's next.
MAX_LINES = 16
_FILE_MODE = 0o644  # dcgm-exporter may run as any user (or in a container): it must read


def slots(host: Host) -> dict[str, str]:
    """Each claim key of the host (GPU UUID, index, MIG UUID) -> its mapping file name.

    >>> from gpuenv.host.machine import Gpu, MigDevice
    >>> mig = MigDevice("MIG-a", gpu_instance=2)
    >>> slots(Host("550", (Gpu(3, "A100", "GPU-x", mig_devices=(mig,)),)))
    {'GPU-x': '3', '3': '3', 'MIG-a': '3.2'}
    """
    out: dict[str, str] = {}
    for gpu in host.gpus:
        out[gpu.key] = out[str(gpu.index)] = str(gpu.index)
        for mig in gpu.mig_devices:
            if mig.gpu_instance is not None:
                out[mig.uuid] = f"{gpu.index}.{mig.gpu_instance}"
    return out


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:64] or "_"


def job_id(claim: ClaimView) -> str:
    """The run's line: `user/project/pid-N`, or `user/project/<container id>` once a
    detached run's container holds the claim. Only safe characters: one line, one run.

    >>> from gpuenv.reservations.claims import Claim
    >>> job_id(Claim("GPU-x", "alice", 1000, 42, "1", "h", "my demo\\nx", 0.0))
    'alice/my_demo_x/pid-42'
    """
    holder = _clean(claim.container[:12]) if claim.container else f"pid-{claim.pid}"
    return f"{_clean(claim.user)}/{_clean(claim.project)}/{holder}"


def mapping(claims: Iterable[ClaimView], hostname: str, names: Mapping[str, str]) -> dict[str, str]:
    """File name -> content for this host's live claims: each claim's GPU named by `names`
    (`slots` of this host); a claim of another host, or of a GPU this host does not list,
    is left out. At most MAX_LINES distinct lines a file."""
    jobs: dict[str, dict[str, set[str]]] = {}  # file -> user -> lines
    for claim in claims:
        slot = names.get(claim.gpu) if claim.host == hostname else None
        if slot is not None and SLOT.fullmatch(slot):
            jobs.setdefault(slot, {}).setdefault(claim.user, set()).add(job_id(claim))
    return {slot: "".join(f"{job}\n" for job in _fair(users)) for slot, users in jobs.items()}


def _fair(users: Mapping[str, set[str]]) -> list[str]:
    """At most MAX_LINES lines, sorted: each user's first (in order) before anyone's
    second, so that one user's many claims cannot push the others' runs out."""
    ranked = sorted((rank, job) for jobs in users.values() for rank, job in enumerate(sorted(jobs)))
    return sorted(job for _, job in ranked[:MAX_LINES])


def mapping_dir(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The folder and where it was set ('' and why not, when it is not): GPUENV_JOB_MAPPING_DIR,
    else `[dcgm_exporter] job_mapping_dir` in the host-wide config."""
    env = os.environ if env is None else env
    if env.get(JOB_MAP_ENV):
        return env[JOB_MAP_ENV], JOB_MAP_ENV
    site = read_site_config(env)
    section = (site.data or {}).get(SITE_SECTION)
    value = section.get(SITE_KEY) if isinstance(section, dict) else None
    if isinstance(value, str) and value:
        return value, f"{site.path} [{SITE_SECTION}] {SITE_KEY}"
    return "", f"no {JOB_MAP_ENV} and no [{SITE_SECTION}] {SITE_KEY} in {site.path}"


@dataclass
class JobMapFolder:
    """An open mapping folder this process may write; `keep` writes what changed and
    removes the number-named entries it did not write (the folder is gpuenv's alone)."""

    path: str
    fd: int
    problems: list[str] = field(default_factory=list)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def keep(self, wanted: Mapping[str, str]) -> None:
        """Make the folder's GPU files say `wanted`: each changed file replaced whole
        (readers see the old list or the new one), files of GPUs nobody holds removed."""
        try:
            present = {n for n in os.listdir(self.fd) if SLOT.fullmatch(n)}
        except OSError as exc:
            self.problems.append(f"{self.path} cannot be listed ({exc.strerror})")
            return
        for name, text in wanted.items():
            if self._read(name) != text:
                self._replace(name, text)
        for name in sorted(present - set(wanted)):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.fd)

    def _read(self, name: str) -> str | None:
        """A plain file's text; None for anything else (a link, a FIFO: replaced)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.fd)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return os.read(fd, MAX_FILE).decode(errors="replace")
        finally:
            os.close(fd)

    def _replace(self, name: str, text: str) -> None:
        """Write a new file under a name dcgm-exporter skips, then rename it over `name`
        (the name itself is replaced, never a link's target)."""
        temp = f".gpuenv.{os.urandom(8).hex()}"
        try:
            fd = os.open(
                temp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                _FILE_MODE,
                dir_fd=self.fd,
            )
            try:
                os.fchmod(fd, _FILE_MODE)  # whatever the umask
                os.write(fd, text.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=self.fd)
            self.problems.append(f"{os.path.join(self.path, name)} not written ({exc.strerror})")


def open_job_map(env: Mapping[str, str] | None = None) -> tuple[JobMapFolder | None, str]:
    """The mapping folder, when one is set and this process may keep it, and a problem
    to report ('' when none): a folder set but missing or unsafe (another ordinary
    user's included) is one; root's folder, on a shared host, is simply not this
    process's to write."""
    try:
        path, source = mapping_dir(env)
    except GpuenvError as exc:
        return None, f"the dcgm-exporter job mapping is not kept: {exc.message}"
    if not path:
        return None, ""
    what = f"the dcgm-exporter job mapping folder ({source})"
    try:
        fd, info = open_folder(path, create=False, what=what)
    except FileNotFoundError:
        return None, f"{what} {path} does not exist: the job mapping is not kept"
    except GpuenvError as exc:
        if _not_ours(path):
            return None, ""
        return None, f"{exc.message}: the job mapping is not kept"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        mode = stat.S_IMODE(info.st_mode)
        return None, (
            f"{what} {path} has mode {mode:o}: other users could rewrite its files, so gpuenv "
            f"does not keep them (`chmod go-w {path}`)"
        )
    return JobMapFolder(os.path.abspath(path), fd), ""


def _not_ours(path: str) -> bool:
    """Whether the folder is a safe one that is simply not ours to write: root's, on a
    shared host, where users' runs are mapped by root's gpuenv, not by them. A folder of
    another ordinary user is no such thing: it is reported."""
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == 0 != os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def keep_claims(
    folder: JobMapFolder, claims: Sequence[ClaimView], hostname: str, names: Mapping[str, str]
) -> None:
    """The one writer: the folder as this host's live claims say, each GPU named by
    `names` (`slots` of this host)."""
    folder.keep(mapping(claims, hostname, names))
