"""`gpuenv run` and `gpuenv shell` once parsed: the real services plugged into the
launch policy, notices on stderr, the command's exit code as ours."""

from __future__ import annotations

import os
import sys
from typing import Any

from gpuenv.app.run import RunRequest, Services, Terminal, launch, oom_advice
from gpuenv.cli.app import freshness
from gpuenv.cli.base import engine, say, view_factory
from gpuenv.host.machine import Host
from gpuenv.monitoring.usage import UsageLog
from gpuenv.reservations.claims import ClaimStore
from gpuenv.reservations.statedir import state_dir
from gpuenv.run.container import invoking_identity
from gpuenv.run.session import stdin_is_input


def _detect_host() -> Host:
    # NVML, nvidia-smi and host files (~40 ms of imports): only for a run that asks for GPUs.
    from gpuenv.host.detect import detect_host

    return detect_host()


def services() -> Services:
    """The real host, claims store, identity and usage log a run (or an editor's
    container) is given."""
    return Services(
        _detect_host,
        ClaimStore,
        invoking_identity,
        usage_log=lambda: UsageLog(state_dir()),
    )


def launch_run(directory: str, quiet: bool, **options: Any) -> None:
    """Run the request to its end and exit with the command's code; a detached run
    prints its container's name and returns."""

    def notice(text: str) -> None:
        if not quiet:
            say(f"gpuenv: {text}")

    wait, wait_timeout = options.pop("wait"), options.pop("wait_timeout")
    options["freshness"] = freshness(options.pop("locked"), options.pop("frozen"))
    request = RunRequest(wait=(wait_timeout or 0.0) if wait or wait_timeout else None, **options)
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    connected = engine()
    outcome = launch(
        directory,
        request,
        connected,
        services=services(),
        terminal=Terminal(tty=tty, stdin=tty or stdin_is_input(), uid=os.getuid()),
        environ=os.environ,
        view=view_factory(quiet),
        notice=notice,
    )
    if outcome.container:
        name = str(connected.inspect(outcome.container).get("Name", outcome.container))
        name = name.lstrip("/")
        sys.stdout.write(f"{name}\n")
        sys.stdout.flush()
        notice(f"started {name}, detached: `gpuenv logs -f {name}`, `gpuenv wait {name}`")
        return
    if outcome.oom_killed:
        say(f"gpuenv: {oom_advice(request.memory)}")
    sys.exit(outcome.exit_code)
