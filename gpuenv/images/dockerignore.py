""".dockerignore with Docker's own rules, so that `--bake` leaves out exactly what
`docker build` would.

A port of moby/patternmatcher (patternmatcher.go: ``New``, ``Pattern.compile``,
``MatchesUsingParentResults``) and of its ``ignorefile.ReadAll``, which BuildKit
(tonistiigi/fsutil's walker) and the classic builder both use. Where they differ from
.gitignore: a pattern is anchored at the context root (``*.md`` matches ``notes.md``,
not ``docs/notes.md``; write ``**/*.md`` for that), a pattern that matches a folder
excludes everything below it, and a later ``!pattern`` re-includes what an earlier one
excluded, the last matching line winning. The test table in tests/unit/test_dockerignore.py
is moby's own (patternmatcher_test.go).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

_ESCAPED = set(".+()|{}$")  # regexp specials that mean nothing in filepath.Match
_EXACT, _PREFIX, _SUFFIX, _REGEXP = "exact", "prefix", "suffix", "regexp"
_WILDCARDS = {"*": "[^/]*", "?": "[^/]"}  # what filepath.Match's wildcards match


class BadPattern(ValueError):
    """A pattern Go's filepath.Match (and so Docker) rejects."""


def clean(path: str) -> str:
    """Go's ``filepath.Clean`` on a slash-separated path.

    >>> clean("a//b/./c/.."), clean("/../x/"), clean(""), clean("./")
    ('a/b', '/x', '.', '.')
    """
    rooted = path.startswith("/")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
            continue
        parts.append(part)
    text = "/".join(parts)
    if rooted:
        return "/" + text
    return text or "."


def read_ignore_file(text: str) -> list[str]:
    """The patterns of a .dockerignore (moby ignorefile.ReadAll): a UTF-8 BOM dropped,
    lines starting with '#' skipped (before trimming), whitespace trimmed, each pattern
    cleaned and a leading '/' dropped (``/foo`` is ``foo``), ``!`` kept.

    >>> read_ignore_file("test1\\n/test2\\n\\n# note\\n! /inverted/abs/path\\n")
    ['test1', 'test2', '!inverted/abs/path']
    """
    out = []
    for number, line in enumerate(text.splitlines()):
        if number == 0:
            line = line.removeprefix("\ufeff")
        if line.startswith("#"):
            continue
        pattern = line.strip()
        if not pattern:
            continue
        invert = pattern.startswith("!")
        if invert:
            pattern = pattern[1:].strip()
        if pattern:
            pattern = clean(pattern)
            if len(pattern) > 1 and pattern.startswith("/"):
                pattern = pattern[1:]
        out.append("!" + pattern if invert else pattern)
    return out


def _check_syntax(pattern: str) -> None:
    """Raise BadPattern where Go's filepath.Match reports ErrBadPattern: a trailing
    backslash, or a character class that is unclosed, empty, or has a bad range."""
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            if i + 1 >= n:
                raise BadPattern(f"{pattern!r}: a trailing '\\' escapes nothing")
            i += 2
            continue
        if ch != "[":
            i += 1
            continue
        i += 1
        if i < n and pattern[i] == "^":
            i += 1
        items = 0
        while True:
            if i < n and pattern[i] == "]" and items:
                i += 1
                break
            i = _class_char(pattern, i)
            if i < n and pattern[i] == "-":
                i = _class_char(pattern, i + 1)
            items += 1


def _class_char(pattern: str, i: int) -> int:
    """Go's getEsc: one (possibly escaped) character of a class; its end."""
    if i >= len(pattern) or pattern[i] in "-]":
        raise BadPattern(f"{pattern!r}: a malformed character class")
    if pattern[i] == "\\":
        i += 1
        if i >= len(pattern):
            raise BadPattern(f"{pattern!r}: a malformed character class")
    i += 1
    if i >= len(pattern):
        raise BadPattern(f"{pattern!r}: an unclosed character class")
    return i


@dataclass
class Pattern:
    """One line: its cleaned text, whether it re-includes (``!``), how it matches."""

    text: str
    exclusion: bool = False
    kind: str = field(init=False, default=_EXACT)
    regexp: re.Pattern[str] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        _check_syntax(self.text)
        self.kind, source = _compile(self.text)
        if self.kind == _REGEXP:
            try:
                self.regexp = re.compile(source)
            except re.error as exc:
                raise BadPattern(f"{self.text!r}: {exc}") from None

    def match(self, path: str) -> bool:
        if self.kind == _EXACT:
            return path == self.text
        if self.kind == _PREFIX:
            return path.startswith(self.text[:-2])
        if self.kind == _SUFFIX:
            suffix = self.text[2:]
            return path.endswith(suffix) or (suffix[:1] == "/" and path == suffix[1:])
        assert self.regexp is not None
        return self.regexp.fullmatch(path) is not None


def _compile(pattern: str) -> tuple[str, str]:
    """patternmatcher's ``compile``: the match kind and, for regexps, the expression."""
    out, kind, i, count = "^", _EXACT, 0, 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            i, text, kind = _double_star(pattern, i + 2, kind, first=count == 0)
        else:
            i, text, is_regexp = _translate(pattern, i)
            if is_regexp:
                kind = _REGEXP
        out += text
        count += 1
    return kind, out + "$"


def _double_star(pattern: str, i: int, kind: str, *, first: bool) -> tuple[int, str, str]:
    """A ``**`` that ends at `i` (with the '/' after it, if any): the index after it, its
    regexp text and the pattern's kind from here. Leading, it makes a suffix match;
    trailing a pattern that was exact so far, a prefix match."""
    if i < len(pattern) and pattern[i] == "/":
        i += 1
    if i < len(pattern):
        text, kind = "(.*/)?", _REGEXP
    elif kind == _EXACT:
        text, kind = "", _PREFIX
    else:
        text, kind = ".*", _REGEXP
    if first:
        kind = _SUFFIX
    return i, text, kind


def _translate(pattern: str, i: int) -> tuple[int, str, bool]:
    """The character at `i` (and what it escapes): the index after it, its regexp text,
    and whether it makes the pattern a regexp."""
    ch = pattern[i]
    i += 1
    if ch in _WILDCARDS:
        return i, _WILDCARDS[ch], True
    if ch in _ESCAPED:
        return i, "\\" + ch, False
    if ch == "\\":
        if i < len(pattern):
            return i + 1, "\\" + pattern[i], True
        return i, "\\\\", False
    return i, ch, ch in "[]"


class PatternMatcher:
    """The patterns of one .dockerignore, in order."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns: list[Pattern] = []
        for raw in patterns:
            text = raw.strip()
            if not text:
                continue
            text = clean(text)
            exclusion = text.startswith("!")
            if exclusion:
                if len(text) == 1:
                    raise BadPattern('illegal exclusion pattern: "!"')
                text = text[1:]
            self.patterns.append(Pattern(text, exclusion))

    def matches(self, path: str, parent: Sequence[bool] | None = None) -> tuple[bool, list[bool]]:
        """Whether `path` (slash-separated, relative) is excluded, and which patterns
        matched it, for its children (``MatchesUsingParentResults``). Without `parent`,
        the path's parent folders are tried against each pattern (Docker does the same)."""
        matched = False
        info = [False] * len(self.patterns)
        for index, pattern in enumerate(self.patterns):
            hit = bool(parent) and parent[index]  # type: ignore[index]
            if not hit:
                if pattern.exclusion != matched:
                    continue
                hit = pattern.match(path)
                if not hit and not parent and "/" in path:
                    folders = path.split("/")[:-1]
                    hit = any(
                        pattern.match("/".join(folders[: depth + 1]))
                        for depth in range(len(folders))
                    )
            info[index] = hit
            if hit:
                matched = not pattern.exclusion
        return matched, info

    def excluded(self, path: str) -> bool:
        """``MatchesOrParentMatches`` of one path (no walk): for checks and tests."""
        cleaned = clean(path)
        return cleaned != "." and self.matches(cleaned)[0]

    def may_include_below(self, folder: str) -> bool:
        """Whether some ``!`` pattern could re-include a path below an excluded `folder`
        (else the walk skips it, as BuildKit does): patterns with wildcards always could."""
        for pattern in self.patterns:
            if not pattern.exclusion:
                continue
            if any(ch in pattern.text for ch in "*?[\\"):
                return True
            if (pattern.text + "/").startswith(folder + "/"):
                return True
        return False
