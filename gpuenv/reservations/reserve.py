"""Reserving GPUs on a shared host: choose and claim under the store's lock, or queue
(first come, first served) until the GPUs are free."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from gpuenv.errors import GpusBusy
from gpuenv.host.machine import Host
from gpuenv.project.spec import GpuRequest
from gpuenv.reservations.claims import Claim, ClaimStore
from gpuenv.reservations.gpus import Grant, choose

RECHECK = 0.5  # seconds between looks while queued, unless the state folder changes


def reserve(
    store: ClaimStore,
    request: GpuRequest,
    host: Host,
    project: str,
    wait: float | None,
    notice: Callable[[str], None],
    unfit: Mapping[str, str] | None = None,
    ignoring: Callable[[Claim], bool] | None = None,
) -> tuple[Grant, list[str]]:
    """Choose and claim GPUs atomically; with `wait` (seconds, 0: no limit), queue until
    they are free, first come first served; never `unfit` ones for a count while enough
    others exist (`gpus.choose`). Claims `ignoring` says are this request's own (an
    editor's container claimed again) do not count against it. Returns the grant and
    the claim files."""
    deadline = None if not wait else time.monotonic() + wait
    ticket: str | None = None
    told = False
    looked = 0.0  # when it last looked under the lock
    try:
        while True:
            if ticket is not None and _behind_others(store, ticket, looked):
                store.touch([ticket])  # the heartbeat that keeps the ticket live
                _check_deadline(deadline, wait)
                store.wait_for_change(RECHECK)
                continue
            looked = time.monotonic()
            with store.locked():
                ticket = _hold_place(store, ticket, wait)
                if ticket is None or store.first_in_queue(ticket):
                    try:
                        claims = [c for c in store.claims() if not (ignoring and ignoring(c))]
                        granted, keys = choose(request, host, claims, unfit)
                    except GpusBusy as busy:
                        if wait is None:
                            raise
                        if ticket is None:
                            ticket = store.enqueue()
                        if not told:
                            notice(f"waiting for free GPUs: {busy.message}")
                            told = True
                    else:
                        return granted, store.add(keys, project)
            _check_deadline(deadline, wait)
            store.wait_for_change(RECHECK)  # a released claim wakes it at once
    finally:
        if ticket is not None:
            store.release([ticket])


def _behind_others(store: ClaimStore, ticket: str, looked: float) -> bool:
    """Whether a waiter need not look under the lock now: tickets queued before its own
    are there (their names sort by when they were taken), so it cannot go first, and it
    looked less than RECHECK ago (a look under the lock also clears a dead waiter's
    ticket). Only the head of the queue takes the lock at each change of the folder: 24
    waiters do not all read every claim each time a GPU is released."""
    return time.monotonic() - looked < RECHECK and store.tickets_before(ticket)


def _check_deadline(deadline: float | None, wait: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise GpusBusy(
            f"no GPUs became free within {wait:g}s",
            hint="wait longer (`--wait-timeout SECONDS`, or `--wait` for no limit); "
            "`gpuenv top` names who holds them",
        )


def _hold_place(store: ClaimStore, ticket: str | None, wait: float | None) -> str | None:
    """The run's place in the queue, under the store's lock: kept alive once it has one;
    else taken behind the runs already queued (GpusBusy naming them without `wait`),
    none while nobody queues."""
    if ticket is not None:
        store.touch([ticket])  # the heartbeat that keeps the ticket live
        return ticket
    queued = store.waiting()
    if queued and wait is None:  # first come, first served: waiters go first
        names = "; ".join(w.describe() for w in queued)
        raise GpusBusy(
            f"other runs are queued for GPUs on this host: {names}",
            hint="queue behind them with --wait (`gpuenv top` shows who uses what)",
        )
    return store.enqueue() if queued else None
