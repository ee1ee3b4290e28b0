"""`$VAR` and `${VAR}` in gpuenv.yaml's `env:`, expanded as a Dockerfile's `ENV` expands
them: against the image's own environment, so `PATH: /opt/tools/bin:$PATH` puts a folder
in front of the image's PATH instead of reaching the container as the text `$PATH`.

The forms are Dockerfile's (docs.docker.com/reference/dockerfile/#environment-replacement):
`$NAME`, `${NAME}`, `${NAME:-word}` (word when NAME is unset or empty), `${NAME:+word}`
(word when NAME is set and not empty); `\\$` is a literal `$`. A name the image does not set
is empty, as in a Dockerfile. Anything else after `$` and `${` is refused with its fix:
never passed on literally, never guessed.

>>> image = {"PATH": "/usr/local/bin:/usr/bin", "CUDA_HOME": "/usr/local/cuda"}
>>> expand("/opt/tools/bin:$PATH", image)
'/opt/tools/bin:/usr/local/bin:/usr/bin'
>>> expand("${CUDA_HOME}/lib64:${LD_LIBRARY_PATH:-/usr/lib}", image)
'/usr/local/cuda/lib64:/usr/lib'
>>> expand(r"costs \\$5", image)
'costs $5'
>>> expand("${PATH", image)
Traceback (most recent call last):
...
gpuenv.project.variables.InvalidReference: '${' is not closed: write ${NAME}, or \\$ for a literal $
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from gpuenv.project.spec import Spec

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_TOKEN = re.compile(
    rf"\\\$|\$(?P<plain>{_NAME})|\$\{{(?P<braced>{_NAME})(?:(?P<op>:[-+])(?P<word>[^}}$]*))?\}}|\$"
)


class InvalidReference(ValueError):
    """A `$` in a value that is no variable reference gpuenv can expand."""


def _matches(value: str) -> Iterator[re.Match[str]]:
    for match in _TOKEN.finditer(value):
        if match[0] == "$":
            rest = value[match.end() :]
            if rest.startswith("{"):
                if "}" not in rest:
                    raise InvalidReference(
                        "'${' is not closed: write ${NAME}, or \\$ for a literal $"
                    )
                raise InvalidReference(
                    f"'${rest[: rest.index('}') + 1]}' is not a reference gpuenv expands "
                    "(${NAME}, ${NAME:-default}, ${NAME:+alternative}): write \\$ for a "
                    "literal $"
                )
            if value[match.end() - 1 :].startswith("$$"):
                raise InvalidReference("'$$' is not a literal $ here: write \\$")
            raise InvalidReference(
                f"a '$' that names no variable at {value[match.start() :][:12]!r}: write \\$ "
                "for a literal $"
            )
        yield match


def references(value: str) -> list[str]:
    """The names `value` refers to, in order; InvalidReference for a `$` that is none.

    >>> references("/opt/bin:$PATH:${HOME:-/root}")
    ['PATH', 'HOME']
    """
    return [match["plain"] or match["braced"] for match in _matches(value) if match[0] != "\\$"]


def expand(value: str, image: Mapping[str, str]) -> str:
    """`value` with every reference replaced by the image's value (empty when unset)."""
    out, end = [], 0
    for match in _matches(value):
        out.append(value[end : match.start()])
        end = match.end()
        if match[0] == "\\$":
            out.append("$")
            continue
        name = match["plain"] or match["braced"]
        current = image.get(name, "")
        if match["op"] == ":-":
            out.append(current or match["word"])
        elif match["op"] == ":+":
            out.append(match["word"] if current else "")
        else:
            out.append(current)
    out.append(value[end:])
    return "".join(out)


def image_environment(config: Mapping[str, Any] | None) -> dict[str, str]:
    """The environment an image's configuration (`Config.Env`, NAME=value entries) sets.

    >>> image_environment({"Env": ["PATH=/usr/bin", "EMPTY=", "junk"]})
    {'PATH': '/usr/bin', 'EMPTY': ''}
    """
    entries = (config or {}).get("Env")
    if not isinstance(entries, (list, tuple)):
        return {}
    pairs = (str(entry).partition("=") for entry in entries if "=" in str(entry))
    return {name: value for name, _, value in pairs}


def expanded(env: Mapping[str, str], image: Mapping[str, str]) -> dict[str, str]:
    """Every value of the spec's `env:` expanded against the image's environment."""
    return {key: expand(value, image) for key, value in env.items()}


def refers(env: Iterable[tuple[str, str]]) -> bool:
    """Whether any value of the spec's `env:` refers to a variable (the image is needed)."""
    return any(references(value) for _, value in env)


def spec_with_image_env(spec: Spec, image: Mapping[str, str]) -> Spec:
    """`spec` with its `env:` values expanded against the image's environment."""
    return replace(spec, env=tuple(sorted(expanded(dict(spec.env), image).items())))
