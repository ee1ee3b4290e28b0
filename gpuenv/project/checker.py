"""The problem collector behind every validation of a user's file: it turns raw YAML
values into checked ones and records each problem with its location."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuenv.errors import Problem
from gpuenv.project.spec import ALIASES, constraint

if TYPE_CHECKING:
    from gpuenv.common.yamlfile import Path as YamlPath
    from gpuenv.common.yamlfile import YamlDocument


class Checker:
    """Collects problems while turning raw YAML values into validated ones."""

    def __init__(self, doc: YamlDocument, project_dir: str) -> None:
        self.doc = doc
        self.project_dir = project_dir
        self.problems: list[Problem] = list(doc.duplicates)
        self.seen_requirements: tuple[str, ...] = ()  # the valid `requirements` entries

    def add(self, path: YamlPath, message: str) -> None:
        self.problems.append(self.doc.problem(path, message))

    def text(self, path: YamlPath, value: Any, what: str) -> str | None:
        """A string field; numbers YAML guessed are read back as the text written."""
        if isinstance(value, bool) or value is None:
            self.add(path, f"expected {what}, got {describe(value)}")
            return None
        if isinstance(value, int | float):
            written = self.doc.number_text(path)
            return str(value) if written is None else written
        if not isinstance(value, str):
            self.add(path, f"expected {what}, got {describe(value)}")
            return None
        if any(ord(ch) < 32 and ch != "\t" for ch in value) or "\x7f" in value:
            self.add(path, f"{what} must not contain control characters or newlines")
            return None
        return value

    def string_list(self, path: YamlPath, value: Any, what: str) -> list[tuple[YamlPath, str]]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            self.add(path, f"expected a list of {what}, got {describe(value)}")
            return []
        out = []
        for index, item in enumerate(items):
            item_path = (*path, index) if not isinstance(value, str) else path
            text = self.text(item_path, item, what)
            if text is not None:
                out.append((item_path, text))
        return out

    def constraint(self, key: str, value: Any) -> str | None:
        text = self.text((key,), value, "a version or version specifier")
        if text is None:
            return None
        from gpuenv.common.versions import InvalidConstraint

        try:
            constraint(text)
        except InvalidConstraint as exc:
            self.add((key,), str(exc))
            return None
        return text.strip()

    def choice(self, key: str, value: Any, choices: tuple[str, ...]) -> str | None:
        text = self.text((key,), value, f"one of {', '.join(choices)}")
        if text is None:
            return None
        if text not in choices:
            self.add(
                (key,), f"'{text}' is not one of {', '.join(choices)}{did_you_mean(text, choices)}"
            )
            return None
        return text


def describe(value: Any) -> str:
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


def did_you_mean(word: str, choices: tuple[str, ...]) -> str:
    lowered = word.lower()
    if lowered in ALIASES and ALIASES[lowered] in choices:
        return f"; did you mean '{ALIASES[lowered]}'?"
    import difflib

    close = difflib.get_close_matches(lowered, choices, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else f" (known: {', '.join(choices)})"
