"""A plain-text progress bar on stderr, redrawn in place at most a few times a second.

    bar = ProgressBar("hicache", total=48)
    bar.update(done=12, running=8, waiting=20, clock_s=14.2)
    bar.close()

    hicache      [#########...........................]  12/48 done | batch  8 | waiting  20 | t 14.2 s

Disabled (`enabled=False`, the command line's --quiet) it prints nothing at all.
"""
from __future__ import annotations

import sys
import time

WIDTH = 36


class ProgressBar:
    def __init__(self, label: str, total: int, enabled: bool = True, stream=None, min_interval_s: float = 0.2):
        self.label, self.total, self.enabled = label, max(1, total), enabled
        self.stream = stream if stream is not None else sys.stderr
        self.min_interval_s = min_interval_s
        self._last = float("-inf")
        self._drawn = False

    def update(self, done: int, running: int, waiting: int, clock_s: float, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < self.min_interval_s):
            return
        self._last = now
        k = WIDTH * done // self.total
        self.stream.write(f"\r{self.label:<12} [{'#' * k}{'.' * (WIDTH - k)}] {done:4d}/{self.total} done | "
                          f"batch {running:2d} | waiting {waiting:4d} | t {clock_s:7.1f} s")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
