"""The JSON schemas gpuenv ships (gpuenv/schemas/*.json), as a test validates with them:
every `--json` output, success or failure, must validate against its command's schema."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
from referencing import Registry, Resource

PREFIX = "urn:gpuenv:schema:"


def names() -> list[str]:
    folder = resources.files("gpuenv") / "schemas"
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


@cache
def schema(name: str) -> dict[str, Any]:
    data = (resources.files("gpuenv") / "schemas" / f"{name}.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(data)
    return loaded


@cache
def _registry() -> Registry:
    registry: Registry = Registry()
    for name in names():
        registry = registry.with_resource(PREFIX + name, Resource.from_contents(schema(name)))
    return registry


def validate(name: str, value: Any) -> None:
    """Raise jsonschema.ValidationError unless VALUE is what `gpuenv NAME --json` may print."""
    jsonschema.Draft202012Validator(schema(name), registry=_registry()).validate(value)


def validate_output(name: str, stdout: str) -> Any:
    """stdout holds exactly one JSON document, valid for NAME; returns it."""
    value = json.loads(stdout)
    validate(name, value)
    return value
