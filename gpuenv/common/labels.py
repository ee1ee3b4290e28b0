"""The label keys gpuenv puts on images and containers (`docker inspect` shows them):
the one vocabulary shared by the image service, runs and the monitor."""

from __future__ import annotations

LABEL_PREFIX = "io.gpuenv"
# The short-lived containers that ask an image a question (what it has, what it says)
PROBE_LABEL = f"{LABEL_PREFIX}.probe"
RUN_LABEL = f"{LABEL_PREFIX}.run"
USAGE_LABEL = f"{LABEL_PREFIX}.usage"  # "<uid>/<usage id>": where the run's usage records are
DETACHED_LABEL = f"{LABEL_PREFIX}.detached"  # a run that outlives its gpuenv process
