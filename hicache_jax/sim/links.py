"""`Link`: one direction of one instance's link as a FIFO queue of transfers.

A transfer of `nbytes` asked for at time `now` starts when the link is free (the
transfers before it have passed) and takes `nbytes / rate` seconds:

    link free at 2.0 s    transfer(now=1.5, 1 GB at 1 GB/s) -> starts 2.0, done 3.0
                          transfer(now=4.0, 1 GB at 1 GB/s) -> starts 4.0, done 5.0

No overlap between transfers of one direction, no sharing between directions (PCIe and
network links are full duplex), no per-transfer latency: what the H200 measurements
behind the default rates show from a few MB up.
"""
from __future__ import annotations

from hicache_jax import validate


class Link:
    """One direction of a link: bytes per second and when it is next free (seconds)."""

    __slots__ = ("name", "rate", "free_at", "bytes_moved", "busy_s")

    def __init__(self, name: str, bytes_per_s: float):
        self.name = name
        self.rate = validate.number(f"rate of link {name!r}", bytes_per_s)
        self.free_at = 0.0
        self.bytes_moved = 0
        self.busy_s = 0.0

    def transfer(self, now: float, nbytes: int) -> float:
        """Queue `nbytes` at `now`; returns when they have arrived (now, for nothing to move)."""
        if nbytes <= 0:
            return now
        seconds = nbytes / self.rate
        done = max(now, self.free_at) + seconds
        self.free_at = done
        self.bytes_moved += nbytes
        self.busy_s += seconds
        return done

    def __repr__(self) -> str:
        return f"Link({self.name!r}, {self.rate / 1e9:g} GB/s, free at {self.free_at:.3f} s)"


__all__ = ["Link"]
