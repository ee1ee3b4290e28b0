"""The problem collector for matrix files: typed reads of raw YAML values, each problem
recorded with its file, line and column (looked up only when there is one)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gpuenv.common.versions import (
    InvalidComputeCapability,
    InvalidDriverVersion,
    compute_capability,
    driver_tuple,
    is_version,
)
from gpuenv.errors import Problem

if TYPE_CHECKING:
    from gpuenv.common.yamlfile import Path as YamlPath
    from gpuenv.common.yamlfile import YamlDocument


class MatrixRows:
    """Validation helpers bound to one document; problems go to a shared list."""

    def __init__(self, doc: YamlDocument, problems: list[Problem]) -> None:
        self.doc = doc
        self.problems = problems

    def add(self, path: YamlPath, message: str) -> None:
        self.problems.append(self.doc.problem(path, message))

    def mapping(
        self, path: YamlPath, value: Any, fields: Iterable[str], optional: Iterable[str] = ()
    ) -> dict[str, Any] | None:
        """A mapping with exactly `fields` (null when unknown), plus the `optional` ones."""
        if not isinstance(value, dict):
            self.add(path, "expected a mapping")
            return None
        required = tuple(fields)
        known = (*required, *optional)
        for key in value:
            if key not in known:
                self.add((*path, str(key)), f"unknown field '{key}' (known: {', '.join(known)})")
        for key in required:
            if key not in value:
                self.add(path, f"missing field '{key}' (write null when unknown)")
        return value

    def text(self, path: YamlPath, value: Any, *, nullable: bool = True) -> str | None:
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            hint = " (quote version numbers)" if isinstance(value, int | float) else ""
            self.add(path, f"expected text, got {value!r}{hint}")
            return None
        return value

    def version(self, path: YamlPath, value: Any, *, nullable: bool = True) -> str | None:
        text = self.text(path, value, nullable=nullable)
        if text is not None and not is_version(text):
            self.add(path, f"'{text}' is not a version")
            return None
        return text

    def driver(self, path: YamlPath, value: Any, *, nullable: bool = True) -> str | None:
        text = self.text(path, value, nullable=nullable)
        if text is None:
            return None
        try:
            driver_tuple(text)
        except InvalidDriverVersion as exc:
            self.add(path, str(exc))
            return None
        return text

    def cc(self, path: YamlPath, value: Any, *, nullable: bool = True) -> str | None:
        text = self.text(path, value, nullable=nullable)
        if text is None:
            return None
        try:
            compute_capability(text)
        except InvalidComputeCapability as exc:
            self.add(path, str(exc))
            return None
        return text

    def choice(self, path: YamlPath, value: Any, choices: tuple[str, ...]) -> str:
        if value not in choices:
            self.add(path, f"{value!r} is not one of {', '.join(choices)}")
            return choices[-1]
        return str(value)

    def text_list(self, path: YamlPath, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list):
            self.add(path, "expected a list")
            return ()
        out = []
        for index, item in enumerate(value):
            text = self.text((*path, index), item, nullable=False)
            if text is not None:
                out.append(text)
        return tuple(out)
