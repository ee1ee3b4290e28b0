"""Command-line overrides of a spec's fields, and the spec a command works on."""

from __future__ import annotations

import os
from typing import NamedTuple

from gpuenv.common.versions import InvalidConstraint, parse_constraint
from gpuenv.errors import UsageError
from gpuenv.project.spec import SPEC_FILENAME, Spec, default_spec, display_path
from gpuenv.project.validate import load_spec


class Overrides(NamedTuple):
    framework: str | None = None
    version: str | None = None
    python: str | None = None
    cuda: str | None = None


def checked_overrides(
    framework: str | None, version: str | None, python: str | None, cuda: str | None
) -> Overrides:
    """Validate --version/--python/--cuda as constraints (a bad one is a usage error)."""
    for flag, value in (("--version", version), ("--python", python), ("--cuda", cuda)):
        if value is not None:
            try:
                parse_constraint(value)
            except InvalidConstraint as exc:
                raise UsageError(f"{flag}: {exc}") from None
    return Overrides(
        framework, version and version.strip(), python and python.strip(), cuda and cuda.strip()
    )


def spec_for(directory: str, overrides: Overrides, *, need_file: bool = False) -> Spec:
    """gpuenv.yaml with the overrides applied; without a file, a default spec for
    --framework (a usage error when neither is there)."""
    if os.path.exists(os.path.join(directory, SPEC_FILENAME)) or need_file:
        spec = load_spec(directory)
    elif overrides.framework:
        spec = default_spec(directory, overrides.framework)
    else:
        raise UsageError(
            f"no {SPEC_FILENAME} in {display_path(directory) or '.'}",
            hint="run `gpuenv init` to write one, or give --framework "
            "(with --version, --python, --cuda) to resolve without a spec",
        )
    return spec.with_overrides(
        framework=overrides.framework,
        version=overrides.version,
        python=overrides.python,
        cuda=overrides.cuda,
    )
