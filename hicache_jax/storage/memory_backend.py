"""An in-process L3 backend over a dict: the null implementation tests and examples use."""
from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from hicache_jax.storage.backend import StorageBackend


class MemoryBackend(StorageBackend):
    """Objects as `bytes` in a dict (each put copies header and payload once, each get once).

    `objects` is public so tests can look at or damage what was stored.
    """

    name = "memory"

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def contains(self, keys: Sequence[str]) -> list[bool]:
        with self._lock:
            return [k in self.objects for k in keys]

    def get(self, keys: Sequence[str], into: Sequence[tuple[memoryview, memoryview]]) -> list[int | None]:
        with self._lock:
            found = [self.objects.get(k) for k in keys]
        return [None if value is None else fill(value, header, payload)
                for value, (header, payload) in zip(found, into, strict=True)]

    def put(self, keys: Sequence[str], objects: Sequence[tuple[bytes, memoryview]]) -> list[bool]:
        values = [b"".join((header, memoryview(payload).cast("B"))) for header, payload in objects]
        with self._lock:
            for key, value in zip(keys, values, strict=True):
                self.objects.setdefault(key, value)
        return [True] * len(values)


def fill(value: bytes, header, payload) -> int:
    """Copy a stored `value` into (header, payload) when the sizes match; return its size.

    A value of another size is left uncopied: the caller sees the size and treats it as a miss.
    """
    head, body = memoryview(header).cast("B"), memoryview(payload).cast("B")
    if len(value) == head.nbytes + body.nbytes:
        src = np.frombuffer(value, np.uint8)
        np.frombuffer(head, np.uint8)[:] = src[:head.nbytes]
        np.frombuffer(body, np.uint8)[:] = src[head.nbytes:]
    return len(value)
