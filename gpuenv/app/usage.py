"""`gpuenv usage`: the GPU-hours of the runs on this host, per user, project or GPU model,
with their cost where the host config prices GPU models."""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpuenv.monitoring.usage import UsageLog, UsageRow, load_prices, parse_since, usage_summary
from gpuenv.reservations.statedir import state_dir


@dataclass(frozen=True)
class UsageReport:
    """The sums, and what they leave out: runs still running (counted until now) and
    runs that ended without an end record (not counted)."""

    by: str  # user, project or gpu
    since: float  # 0: every record
    priced: bool  # the host config prices GPU models: each row has a cost, or None
    currency: str | None
    rows: list[UsageRow]
    running: int
    unrecorded: int


def usage_report(since: str | None, by: str, now: float | None = None) -> UsageReport:
    """GPU-hours per `by` after `since` (a duration back from now, or a date), every
    record without it; root sees every user's runs, a user their own."""
    now = time.time() if now is None else now
    start = parse_since(since, now) if since else 0.0
    prices = load_prices()
    found = usage_summary(
        UsageLog(state_dir()), by, start, now, prices.per_gpu_hour if prices else None
    )
    return UsageReport(
        by,
        start,
        prices is not None,
        prices.currency if prices else None,
        found.rows,
        found.running,
        found.unrecorded,
    )
