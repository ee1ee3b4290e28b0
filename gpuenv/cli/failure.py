"""A failure as one JSON object (`--json`): what scripts read instead of stderr.

Every command's --json failure has this shape (gpuenv/schemas/error.json): `ok` false,
the `exit_code`, and an `error` with its `type`, `message` and `hint`, plus what the
error knows: located `problems`, the file `path`, and for a failed resolution the
`candidates` with the reasons each was rejected.
"""

from __future__ import annotations

from typing import Any

import click

from gpuenv.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    FileAccessError,
    GpuenvError,
    ProblemsError,
    ResolutionError,
)


def candidate_data(candidate: Any) -> dict[str, Any]:
    """One resolver candidate: the image and, when rejected, why (check and reason)."""
    row = candidate.row
    return {
        "image": row.image,
        "tag": row.tag,
        "framework_version": row.framework_version,
        "cuda": row.cuda,
        "python": row.python,
        "min_driver": str(candidate.min_driver) if candidate.min_driver else None,
        "fits": not candidate.rejections,
        "rejections": [{"check": r.check, "reason": r.reason} for r in candidate.rejections],
    }


def error_fields(exc: GpuenvError) -> dict[str, Any]:
    """The `error` member: type, message, hint and what this kind of error carries."""
    error: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": exc.message,
        "hint": exc.hint,
    }
    if isinstance(exc, ProblemsError):
        error["problems"] = [
            {
                "file": p.file,
                "line": p.line,
                "column": p.column,
                "field": p.field,
                "message": p.message,
            }
            for p in exc.problems
        ]
    if isinstance(exc, FileAccessError):
        error["path"] = exc.path
    if isinstance(exc, ResolutionError):
        error["explanation"] = list(exc.explanation)
        error["candidates"] = [candidate_data(c) for c in exc.candidates]
    return error


def error_data(exc: GpuenvError, code: int | None = None) -> dict[str, Any]:
    """With `code` (a pass-through command's 125-127), `reason_code` keeps the error's own."""
    data: dict[str, Any] = {"ok": False, "exit_code": code or exc.exit_code}
    if code is not None and code != exc.exit_code:
        data["reason_code"] = exc.exit_code
    return {**data, "error": error_fields(exc)}


def usage_data(exc: click.ClickException) -> dict[str, Any]:
    """A command-line mistake click found (an unknown option, a bad flag value)."""
    return {
        "ok": False,
        "exit_code": exc.exit_code or EXIT_USAGE,
        "error": {"type": "UsageError", "message": exc.format_message(), "hint": None},
    }


def internal_data(exc: Exception, code: int = EXIT_INTERNAL) -> dict[str, Any]:
    return {
        "ok": False,
        "exit_code": code,
        "error": {
            "type": "InternalError",
            "message": f"internal error: {type(exc).__name__}: {exc}",
            "hint": "this is a bug in gpuenv; run again with --debug and report the traceback",
        },
    }


def interrupted_data() -> dict[str, Any]:
    """Ctrl-C: the command stopped before it finished."""
    return {
        "ok": False,
        "exit_code": EXIT_INTERRUPTED,
        "error": {"type": "Interrupted", "message": "interrupted", "hint": None},
    }
