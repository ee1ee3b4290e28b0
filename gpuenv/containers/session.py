"""Run one container like a local process: live output, the terminal and stdin when we
have them, signals forwarded (a second Ctrl-C kills), the exit code passed back, and the
container removed whatever happens. Containers of gpuenv processes that died (SIGKILL)
are removed by the next run.
"""

from __future__ import annotations

import calendar
import contextlib
import os
import signal
import socket
import stat
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from gpuenv.common.files import file_from_archive
from gpuenv.common.labels import DETACHED_LABEL, RUN_LABEL, USAGE_LABEL
from gpuenv.containers.config import Identity, accounts_archive, merge_accounts
from gpuenv.containers.publish import port_taken
from gpuenv.engine.protocol import ContainerEngine, Stream, frames
from gpuenv.errors import EngineRefused, GpuPathBroken, GpuRuntimeMissing, StartError
from gpuenv.host.procfs import process_gone

_NO_DRIVER = "could not select device driver"


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    oom_killed: bool
    container: str = ""  # a detached run's container, which goes on running


def stdin_is_input() -> bool:
    """Whether stdin carries input worth attaching: a terminal, a pipe or a file."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False
    return sys.stdin.isatty() or stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def reap_orphans(
    api: ContainerEngine,
    ended: Callable[[str, int | None, float | None], None] | None = None,
) -> list[str]:
    """Remove run containers whose gpuenv process (on this host) is gone; never a
    detached run that was started. `ended` gets each one's usage label, exit code and end
    (None, None: it was still running)."""
    removed = []
    hostname = socket.gethostname()
    for container in api.containers(RUN_LABEL):
        labels = container.get("Labels") or {}
        if labels.get("io.gpuenv.host") != hostname:
            continue
        # A detached run outlives its gpuenv process by design: only one whose process
        # died before starting it (still "created") is an orphan.
        if labels.get(DETACHED_LABEL) == "1" and container.get("State") != "created":
            # Its container is kept for `logs` and `wait`; its usage record ends with it.
            if container.get("State") != "running" and ended and labels.get(USAGE_LABEL):
                ended(labels[USAGE_LABEL], *_ended(api, container))
            continue
        try:
            pid = int(labels.get("io.gpuenv.pid", ""))
        except ValueError:
            continue
        if not process_gone(pid, labels.get("io.gpuenv.pid-start", "")):
            continue
        exit_code, end = (
            _ended(api, container) if container.get("State") != "running" else (None, None)
        )
        api.remove(container["Id"])
        if ended is not None and labels.get(USAGE_LABEL):
            ended(labels[USAGE_LABEL], exit_code, end)
        names = container.get("Names") or [container["Id"][:12]]
        removed.append(str(names[0]).lstrip("/"))
    return removed


def _ended(api: ContainerEngine, container: Mapping[str, Any]) -> tuple[int | None, float | None]:
    """A stopped container's exit code and when it finished (Docker's FinishedAt)."""
    return finished(api.inspect(container["Id"]))


def finished(details: Mapping[str, Any]) -> tuple[int | None, float | None]:
    """The exit code and end (FinishedAt, UTC) of an inspected container."""
    state = details.get("State") or {}
    when = str(state.get("FinishedAt") or "")[:19]
    try:
        end: float | None = float(calendar.timegm(time.strptime(when, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        end = None
    code = state.get("ExitCode")
    return (int(code) if isinstance(code, int) else None), end


def _write(kind: int, data: bytes) -> None:
    stream = sys.stderr.buffer if kind == 2 else sys.stdout.buffer
    stream.write(data)
    stream.flush()


@contextlib.contextmanager
def _raw_terminal(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        # TCSANOW, not setraw's default TCSAFLUSH, which would drop what the user typed
        # while the image was checked and the GPUs claimed: those keys reach the command.
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _signals(handlers: Mapping[int, Callable[[int, FrameType | None], None]]) -> Iterator[None]:
    previous = {number: signal.signal(number, handler) for number, handler in handlers.items()}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _pump_stdin(sock: Stream, on_interrupt_byte: Callable[[], None] | None) -> None:
    fd = sys.stdin.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            if on_interrupt_byte is not None and b"\x03" in data:
                on_interrupt_byte()
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return


def _upload_identity(
    api: ContainerEngine,
    container: str,
    identity: Identity,
    accounts: tuple[str, str] | None,
) -> None:
    """The invoking user's passwd/group entries and HOME, in one upload. The image's own
    files come from the build stamp (`accounts`), else from the container."""
    if accounts is None:
        passwd = file_from_archive(api.get_archive(container, "/etc/passwd"))
        group = file_from_archive(api.get_archive(container, "/etc/group"))
    else:
        passwd, group = accounts
    passwd, group = merge_accounts(passwd, group, identity)
    api.put_archive(container, "/", accounts_archive(passwd, group, identity))


def _no_driver(exc: EngineRefused) -> GpuRuntimeMissing | GpuPathBroken | StartError:
    if _NO_DRIVER in exc.message:
        return GpuRuntimeMissing(
            "this Docker engine cannot give containers GPUs "
            f"({exc.message}): the NVIDIA Container Toolkit is missing",
            hint="install the NVIDIA Container Toolkit and restart Docker "
            "(https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/), "
            "or run with --gpus none (or `gpus: optional` in gpuenv.yaml)",
        )
    if "CDI" in exc.message:
        return _cdi_refused(exc)
    if port_taken(exc.message):
        return StartError(
            f"the container did not start: a port it publishes is taken ({exc.message})",
            hint="choose another host port, or 0 for a free one (-p 0:PORT); `gpuenv ps` "
            "shows the ports of runs",
        )
    return StartError(f"the container did not start: {exc.message}")


def start_detached(
    api: ContainerEngine,
    config: Mapping[str, Any],
    *,
    name: str | None,
    identity: Identity | None,
    accounts: tuple[str, str] | None,
    after_start: Callable[[str], None],
) -> str:
    """Create and start a run that outlives this process; `after_start(container)` once
    it runs (it hands the GPU claims to the container: until then they stay this
    process's, so a container still starting is never taken for one that holds
    nothing). Returns the container's id. The container is kept after it exits
    (`gpuenv logs`, `gpuenv wait`); what fails before the hand-over removes it."""
    container = create_container(api, config, name)
    try:
        if identity is not None:
            _upload_identity(api, container, identity, accounts)
        start_container(api, container)
        after_start(container)
    except BaseException:
        api.remove(container)
        raise
    return container


def create_container(
    api: ContainerEngine, config: Mapping[str, Any], name: str | None = None
) -> str:
    """Create the container; a refusal of its CDI devices says what to do about them."""
    try:
        return api.create(config, name)
    except EngineRefused as exc:
        if "CDI" in exc.message or "cdi" in exc.message:
            raise _cdi_refused(exc) from None
        raise


def start_container(api: ContainerEngine, container: str) -> None:
    """Start it; an engine that cannot give it GPUs says so (GpuRuntimeMissing)."""
    try:
        api.start(container)
    except EngineRefused as exc:
        raise _no_driver(exc) from None


def _cdi_refused(exc: EngineRefused) -> GpuPathBroken:
    return GpuPathBroken(
        f"the engine could not give the container its CDI devices: {exc.message}",
        hint="`gpuenv doctor` checks the CDI specs; regenerate them "
        "(`sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`), or run with --gpus none",
    )


def run_container(
    api: ContainerEngine,
    config: Mapping[str, Any],
    *,
    identity: Identity | None,
    accounts: tuple[str, str] | None = None,
    tty: bool,
    stdin: bool,
    second_interrupt_kills: bool = True,
    notice: Callable[[str], None] = lambda text: None,
    ended: Callable[[], None] = lambda: None,
    started: Callable[[str], None] = lambda container: None,
) -> Outcome:
    """Create, attach, start, stream, wait, remove: the container as a local process.
    `ended` is called once its command has ended, before the removal (the GPUs are free
    then: a queued run need not wait for the cleanup); `started` once it runs. Raises
    GpuRuntimeMissing (after removing the container) when the engine cannot give the
    container GPUs."""
    container = create_container(api, config)
    try:
        if identity is not None:
            _upload_identity(api, container, identity, accounts)
        sock, ahead = _attach(api, container, stdin)
        with contextlib.closing(sock):
            start_container(api, container)
            started(container)
            interrupt = Interrupt(api, container, notice)
            with _signals(_handlers(api, container, interrupt, tty)), _raw_terminal(tty):
                if stdin:
                    on_byte = interrupt if tty and second_interrupt_kills else None
                    threading.Thread(target=_pump_stdin, args=(sock, on_byte), daemon=True).start()
                _stream(sock, ahead, tty)
        code = api.wait(container)  # the output ended with the command: its exit code
        ended()
        # Only a SIGKILLed command (137) can have been killed for memory: ask then only.
        oom = code == 137 and bool(api.inspect(container).get("State", {}).get("OOMKilled"))
        return Outcome(code, oom)
    finally:
        api.remove(container)


class Interrupt:
    """Ctrl-C for the container: the first stops the command (SIGINT), the next kills it."""

    def __init__(self, api: ContainerEngine, container: str, notice: Callable[[str], None]):
        self.api, self.container, self.notice = api, container, notice
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.count += 1
            first = self.count == 1
        if first:
            self.notice("stopping the container (Ctrl-C again to kill it)")
            self.api.kill(self.container, "SIGINT")
        else:
            self.api.kill(self.container, "SIGKILL")


def _attach(api: ContainerEngine, container: str, stdin: bool) -> tuple[Stream, bytes]:
    """The container's streams, attached before it starts so that no output is lost."""
    try:
        return api.attach(container, stdin)
    except EngineRefused as exc:
        # Podman prepares the container (runtime, CDI devices) when it is attached.
        if "CDI" in exc.message:
            raise _cdi_refused(exc) from None
        raise StartError(f"the container did not start: {exc.message}") from None


def _handlers(
    api: ContainerEngine, container: str, interrupt: Interrupt, tty: bool
) -> dict[int, Callable[[int, FrameType | None], None]]:
    """Signals to the container: Ctrl-C (twice kills), TERM and HUP stop it, a resized
    terminal resizes its."""
    handlers: dict[int, Callable[[int, FrameType | None], None]] = {
        signal.SIGINT: lambda *_: interrupt(),
        signal.SIGTERM: lambda *_: api.kill(container, "SIGTERM"),
        signal.SIGHUP: lambda *_: api.kill(container, "SIGTERM"),
    }
    if tty:

        def resize(*_: object) -> None:
            size = os.get_terminal_size(sys.stdout.fileno())
            api.resize(container, size.lines, size.columns)

        handlers[signal.SIGWINCH] = resize
        resize()
    return handlers


def _stream(sock: Stream, ahead: bytes, tty: bool) -> None:
    """The container's output to ours until it ends: as it is from a terminal,
    demultiplexed into stdout and stderr otherwise (`frames`, as the logs are)."""
    for kind, data in frames(_received(sock, ahead), tty):
        _write(kind, data)


def _received(sock: Stream, ahead: bytes) -> Iterator[bytes]:
    """What the engine sends on the attached stream, from the bytes read ahead, until
    it closes the stream (or the connection breaks)."""
    yield ahead
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return
        if not chunk:
            return
        yield chunk
