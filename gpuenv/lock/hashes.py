"""The hashes a project wrote itself (``--hash`` on a requirement line,
``--require-hashes``, uv.lock's), checked against the files gpuenv locks: adopting gpuenv
never drops a protection the project had."""

from __future__ import annotations

from gpuenv.errors import Problem, SpecError
from gpuenv.lock.overlay import Overlay
from gpuenv.project.dependencies import InstallPlan
from gpuenv.project.sources import Dependency


def check_user_hashes(plan: InstallPlan, overlay: Overlay) -> None:
    """SpecError (exit 3) naming every locked file whose sha256 is not among those the
    project allows for its package, and, under --require-hashes, every locked package
    the project names no hash for (pip's own rule: all or none)."""
    allowed: dict[str, list[Dependency]] = {}
    for dependency in (*plan.install, *plan.no_isolation, *plan.constraints):
        if dependency.hashes:
            allowed.setdefault(dependency.name, []).append(dependency)
    problems = []
    for package in overlay.packages:
        for dependency in allowed.get(package.name, []):
            if package.sha256 not in dependency.hashes:
                listed = ", ".join(f"sha256:{h[:16]}…" for h in dependency.hashes)
                problems.append(
                    _problem(
                        dependency.where,
                        f"{package.pin()} resolved to {package.file} "
                        f"(sha256:{package.sha256}), which is not a hash the project allows "
                        f"for {package.name} ({listed})",
                    )
                )
        if plan.require_hashes and package.name not in allowed:
            problems.append(
                _problem(
                    plan.require_hashes[0],
                    f"--require-hashes, but {package.pin()} (a dependency, installed on the "
                    "image) has no --hash line: pin every package with its hashes "
                    "(`pip-compile --generate-hashes` or `uv pip compile --generate-hashes` "
                    "writes them)",
                )
            )
    if problems:
        raise SpecError(
            problems,
            hint="pin the version each hash was made for, or, once you trust the new "
            "file, write the hashes again (`pip-compile --generate-hashes` or `uv pip "
            "compile --generate-hashes`)",
        )


def _problem(where: str, message: str) -> Problem:
    file, _, line = where.partition(":")
    return Problem(file, int(line) if line.isdigit() else None, None, None, message)
