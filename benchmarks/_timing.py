"""Interleaved timing so that machine noise hits every variant alike; ratios are what we report."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def interleaved_medians(fns: dict[str, Callable[[], None]], rounds: int = 15, inner: int = 5, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each function, measured in alternating rounds."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) for k, v in samples.items()}
