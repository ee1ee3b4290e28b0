"""`python -m gpuenv.cli`: the same as the `gpuenv` command."""

from gpuenv.cli import entry

entry()
