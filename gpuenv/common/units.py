"""Quantities for people: how long, in the words `ps`, `top`, `idle` and their
messages share."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """For people: 2h05m, 3m20s, 7s.

    >>> [duration(s) for s in (7, 200, 7500)]
    ['7s', '3m20s', '2h05m']
    """
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
