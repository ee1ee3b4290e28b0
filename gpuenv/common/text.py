"""Text that came from elsewhere (a user's command or project name, an engine's answer, a
GPU's name) made safe to show on someone's terminal.

On a shared server one user's text lands in every other user's `ps` and `top`. Control
bytes (ESC starts a terminal sequence that can clear the screen, set the title or make a
hyperlink), Unicode's bidirectional overrides (which reorder what is shown, CVE-2021-42574)
and line and paragraph separators are shown as escapes (``\\x1b``, ``\\u202e``), never sent
to the terminal; very long text is cut with its length said. Markup is the viewer's
business (`gpuenv.cli.ui.cell` escapes it); this module is pure.
"""

from __future__ import annotations

import unicodedata

__all__ = ["CELL_LIMIT", "visible"]

CELL_LIMIT = 200  # characters of one table cell; the full text stays in --json

# The bidirectional formatting characters of Unicode's UAX #9 (embeddings, overrides,
# isolates, marks): shown, never applied.
BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _shown(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, limit: int = 0, lines: bool = False) -> str:
    """`text` with every control, bidirectional and separator character escaped; with
    `lines`, line breaks and tabs are kept (a message of several lines); with `limit`,
    cut to that many characters.

    >>> visible("a\\x1b[2Jb")
    'a\\\\x1b[2Jb'
    >>> visible("evil\\u202etxt.exe")
    'evil\\\\u202etxt.exe'
    >>> visible("two\\nlines"), visible("two\\nlines", lines=True)
    ('two\\\\x0alines', 'two\\nlines')
    >>> visible("x" * 50, limit=20)
    'xxxxxxxx… (50 chars)'
    """
    out = []
    for char in text:
        if lines and char in "\n\t":
            out.append(char)
        elif char in BIDI or unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            out.append(_shown(char))
        else:
            out.append(char)
    shown = "".join(out)
    if limit and len(shown) > limit:
        tail = f"… ({len(text)} chars)"
        shown = shown[: max(1, limit - len(tail))] + tail
    return shown
