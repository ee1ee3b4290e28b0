"""`python -m gpuenv.cli.keeper CONTAINER CLAIM...`: the process `gpuenv run -d` leaves
behind to hold its claims while the container runs (`gpuenv.app.keeper`). It inherits
the claims' locked descriptors and the environment that names the engine and the state
folder; nothing it says is shown (its output goes nowhere)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from gpuenv.app.keeper import follow, keep
from gpuenv.cli.base import engine
from gpuenv.errors import GpuenvError
from gpuenv.sharing.claims import CLAIM_PREFIX, ClaimStore


def main(argv: Sequence[str] | None = None) -> int:
    container, *names = list(sys.argv[1:] if argv is None else argv)
    if not names or not all(n.startswith(CLAIM_PREFIX) and "/" not in n for n in names):
        return 2
    try:
        store = ClaimStore()
    except GpuenvError:  # the folder cannot be opened now: hold the locks all the same
        follow(engine(), container)
        return 1  # the files stay, dead: the owner's next command deletes them
    keep(engine(), container, store, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
