"""`python -m gpuenv.cli.keeper CONTAINER CLAIM...`: the process `gpuenv run -d` leaves
behind to hold its claims while the container runs (`gpuenv.app.keeper`); with
`--named NAME CLAIM...`, the one `gpuenv devcontainer-claim` leaves for the editor's
container called NAME, which does not run yet. It inherits
the claims' locked descriptors and the environment that names the engine and the state
folder; nothing it says is shown (its output goes nowhere)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from gpuenv.app.keeper import hold_claims, is_claim_name
from gpuenv.cli.context import Application


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    named = words[:1] == ["--named"]
    rest = words[1:] if named else words
    if len(rest) < 2 or not all(is_claim_name(n) for n in rest[1:]):
        return 2
    container, *names = rest
    return hold_claims(Application().engine(), container, names, named=named)


if __name__ == "__main__":
    sys.exit(main())
