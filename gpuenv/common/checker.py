"""The one way gpuenv validates a file a person wrote or may edit (gpuenv.yaml, the
matrix, the overlay, a host file): raw YAML values in, checked values out, and every
problem collected with its file, line and column, all reported at once.

A `Checker` is bound to one parsed document; its problems may go to a list several
documents share (the matrix is several files). The typed reads return None (or an
empty value) for what is wrong, after recording why, so validation goes on.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Any

from gpuenv.common.versions import (
    ComputeCapability,
    DriverVersion,
    InvalidComputeCapability,
    InvalidConstraint,
    InvalidDriverVersion,
    is_version,
    parse_constraint,
)
from gpuenv.common.yamlfile import Path, YamlDocument
from gpuenv.errors import Problem


class Checker:
    """Collects problems while turning one document's raw values into validated ones."""

    def __init__(self, doc: YamlDocument, problems: list[Problem] | None = None) -> None:
        self.doc = doc
        self.problems = problems if problems is not None else []
        self.problems.extend(doc.duplicates)

    def add(self, path: Path, message: str) -> None:
        self.problems.append(self.doc.problem(path, message))

    def mapping(
        self, path: Path, value: Any, fields: Iterable[str], optional: Iterable[str] = ()
    ) -> dict[str, Any] | None:
        """A mapping with exactly `fields` (null when unknown), plus the `optional` ones."""
        if not isinstance(value, dict):
            self.add(path, f"expected a mapping, got {describe(value)}")
            return None
        required = tuple(fields)
        known = (*required, *optional)
        for key in value:
            if key not in known:
                self.add((*path, str(key)), f"unknown field '{key}'{did_you_mean(str(key), known)}")
        for key in required:
            if key not in value:
                self.add(path, f"missing field '{key}' (write null when unknown)")
        return value

    def text(
        self,
        path: Path,
        value: Any,
        what: str = "text",
        *,
        nullable: bool = False,
        numbers: bool = False,
    ) -> str | None:
        """A string. With `numbers`, a number YAML guessed (`version: 2.4`) is read back
        as the text written; without, it is a problem that says to quote it."""
        if value is None and nullable:
            return None
        if numbers and isinstance(value, int | float) and not isinstance(value, bool):
            written = self.doc.number_text(path)
            return str(value) if written is None else written
        if not isinstance(value, str):
            number = isinstance(value, int | float) and not isinstance(value, bool)
            quote = " (write it in quotes)" if number else ""
            self.add(path, f"expected {what}, got {describe(value)}{quote}")
            return None
        if any(ord(ch) < 32 and ch != "\t" for ch in value) or "\x7f" in value:
            self.add(path, f"{what} must not contain control characters or newlines")
            return None
        return value

    def text_list(self, path: Path, value: Any, what: str = "text") -> tuple[str, ...]:
        """A list of strings (the valid ones; each bad item is a problem)."""
        return tuple(text for _, text in self.located_texts(path, value, what, single=False))

    def located_texts(
        self, path: Path, value: Any, what: str, *, single: bool = True
    ) -> list[tuple[Path, str]]:
        """The strings of a list with where each is; with `single`, one string stands
        for a list of one."""
        items = [value] if single and isinstance(value, str) else value
        if not isinstance(items, list):
            self.add(path, f"expected a list of {what}, got {describe(value)}")
            return []
        out = []
        for index, item in enumerate(items):
            item_path = path if items is not value else (*path, index)
            text = self.text(item_path, item, what)
            if text is not None:
                out.append((item_path, text))
        return out

    def version(self, path: Path, value: Any, *, nullable: bool = True) -> str | None:
        text = self.text(path, value, "a version", nullable=nullable)
        if text is not None and not is_version(text):
            self.add(path, f"'{text}' is not a version")
            return None
        return text

    def constraint(self, path: Path, value: Any) -> str | None:
        """A version or PEP 440 specifier (`2.4`, `>=3.10`); numbers read as written."""
        text = self.text(path, value, "a version or version specifier", numbers=True)
        if text is None:
            return None
        try:
            parse_constraint(text)
        except InvalidConstraint as exc:
            self.add(path, str(exc))
            return None
        return text.strip()

    def driver(self, path: Path, value: Any, *, nullable: bool = True) -> DriverVersion | None:
        text = self.text(
            path, value, 'a quoted driver version like "535.104.05"', nullable=nullable
        )
        if text is None:
            return None
        try:
            return DriverVersion.parse(text)
        except InvalidDriverVersion as exc:
            self.add(path, str(exc))
            return None

    def compute_capability(
        self, path: Path, value: Any, *, nullable: bool = True
    ) -> ComputeCapability | None:
        text = self.text(
            path, value, "a compute capability like 8.0", nullable=nullable, numbers=True
        )
        if text is None:
            return None
        try:
            return ComputeCapability.parse(text)
        except InvalidComputeCapability as exc:
            self.add(path, str(exc))
            return None

    def choice(
        self,
        path: Path,
        value: Any,
        choices: tuple[str, ...],
        aliases: Mapping[str, str] | None = None,
    ) -> str | None:
        """One of `choices`; a miss says the nearest one (or what `aliases` maps it to)."""
        text = self.text(path, value, f"one of {', '.join(choices)}")
        if text is None:
            return None
        if text not in choices:
            known = ", ".join(choices)
            self.add(path, f"'{text}' is not one of {known}{did_you_mean(text, choices, aliases)}")
            return None
        return text

    def whole_number(
        self, path: Path, value: Any, *, minimum: int = 0, maximum: int | None = None
    ) -> int | None:
        """A whole number of at least `minimum` and at most `maximum` (None: not given)."""
        if value is None:
            return None
        if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
            bound = f"from {minimum} to {maximum}" if maximum is not None else f"≥ {minimum}"
            self.add(path, f"expected a whole number {bound}, got {describe(value)}")
            return None
        return value

    def number(
        self, path: Path, value: Any, within: tuple[float, float] | None = None, unit: str = ""
    ) -> float | int | None:
        """A finite number, `within` (low, high) when given (None: not given). NaN and
        the infinities, which Python's JSON reader takes, are no measurement."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.add(path, f"expected a number, got {describe(value)}")
            return None
        if not math.isfinite(value):
            written = "NaN" if math.isnan(value) else "-Infinity" if value < 0 else "Infinity"
            self.add(path, f"expected a finite number, got {written}")
            return None
        if within is not None and not within[0] <= value <= within[1]:
            low, high = (f"{bound:g}" for bound in within)
            self.add(path, f"expected a number from {low} to {high}{unit}, got {value:g}")
            return None
        return value


def describe(value: Any) -> str:
    """A raw value as a message names it.

    >>> describe(None), describe(True), describe([1]), describe("x")
    ('nothing', 'the boolean true', 'a list', "'x'")
    """
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"'{value}'"
    return f"a {type(value).__name__} ({value})"


def did_you_mean(
    word: str, choices: tuple[str, ...], aliases: Mapping[str, str] | None = None
) -> str:
    """What a misspelt `word` probably meant, else the known choices.

    >>> did_you_mean("pytroch", ("pytorch", "jax"))
    "; did you mean 'pytorch'?"
    """
    lowered = word.lower()
    if aliases and lowered in aliases and aliases[lowered] in choices:
        return f"; did you mean '{aliases[lowered]}'?"
    close = difflib.get_close_matches(lowered, choices, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else f" (known: {', '.join(choices)})"
