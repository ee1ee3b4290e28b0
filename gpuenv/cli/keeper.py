"""`python -m gpuenv.cli.keeper CONTAINER CLAIM...`: the process `gpuenv run -d` leaves
behind to hold its claims while the container runs (`gpuenv.app.keeper`); with
`--named NAME CLAIM...`, the one `gpuenv devcontainer-claim` leaves for the editor's
container called NAME, which does not run yet. It inherits
the claims' locked descriptors and the environment that names the engine and the state
folder; nothing it says is shown (its output goes nowhere)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from gpuenv.app.keeper import (
    GRACE,
    START_PATIENCE,
    follow,
    follow_named,
    keep,
    keep_named,
)
from gpuenv.cli.context import Application
from gpuenv.errors import GpuenvError
from gpuenv.reservations.claims import CLAIM_PREFIX, ClaimStore


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    named = words[:1] == ["--named"]
    rest = words[1:] if named else words
    if len(rest) < 2 or not all(n.startswith(CLAIM_PREFIX) and "/" not in n for n in rest[1:]):
        return 2
    container, *names = rest
    connected = Application().engine()
    try:
        store = ClaimStore()
    except GpuenvError:  # the folder cannot be opened now: hold the locks all the same
        if named:
            follow_named(connected, container, START_PATIENCE, GRACE, 1.0)
        else:
            follow(connected, container)
        return 1  # the files stay, dead: the owner's next command deletes them
    if named:
        keep_named(connected, container, store, names)
    else:
        keep(connected, container, store, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
