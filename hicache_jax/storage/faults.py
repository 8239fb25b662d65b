"""A backend wrapper that counts calls and misbehaves on demand, for tests of the L3 paths.

    faulty = FaultyBackend(MemoryBackend())
    faulty.raise_on.add("get")              # the next gets raise InjectedFault
    faulty.stall_on.add("exists")           # exists blocks until faulty.release()
    faulty.damage["deepseek_v4_c4/"] = "checksum"   # objects of that pool read back damaged
    faulty.hidden_pools.add("deepseek_v4_c4_indexer")   # those objects look absent

`calls` counts round trips per method and `batch_keys` records the keys of each, so a
test can assert what a code path cost. A damaged object is still returned by the engine
(as a torn write, a cut-off file or another key's value would be); it is the reader's
checks that must turn it into a miss.
"""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

import numpy as np

from hicache_jax.storage.backend import StorageBackend
from hicache_jax.storage.objects import KEY_OFFSET

DAMAGE = ("checksum", "bad_header", "foreign", "truncated", "oversize")


class InjectedFault(RuntimeError):
    """Raised by `FaultyBackend` where a test asked for a failure."""


class FaultyBackend(StorageBackend):
    def __init__(self, inner: StorageBackend):
        self.inner = inner
        self.name = f"faulty:{inner.name}"
        self.calls: Counter = Counter()
        self.batch_keys: list[tuple[str, int]] = []   # (method, keys) per call, in order
        self.raise_on: set[str] = set()
        self.stall_on: set[str] = set()
        self.damage: dict[str, str] = {}            # key substring -> one of DAMAGE
        self.hidden_pools: set[str] = set()
        self._released = threading.Event()
        self._lock = threading.Lock()

    def release(self) -> None:
        """Let every stalled call (and every later one) go on."""
        self._released.set()

    def contains(self, keys: Sequence[str]) -> list[bool]:
        self._enter("contains", keys)
        flags = self.inner.contains(keys)
        return [f and not self._hidden(k) for k, f in zip(keys, flags)]

    def exists(self, keys: Sequence[str]) -> int:
        self._enter("exists", keys)
        flags = self.inner.contains(keys)   # one round trip of the inner store, counted once here
        flags = [f and not self._hidden(k) for k, f in zip(keys, flags)]
        return next((i for i, f in enumerate(flags) if not f), len(flags))

    def get(self, keys: Sequence[str], into) -> list:
        self._enter("get", keys)
        sizes = self.inner.get(keys, into)
        out = []
        for key, size, (header, payload) in zip(keys, sizes, into):
            if self._hidden(key):
                out.append(None)
                continue
            kind = next((how for part, how in self.damage.items() if part in key), None)
            out.append(size if kind is None or not isinstance(size, int) else _damage(kind, size, header, payload))
        return out

    def put(self, keys: Sequence[str], objects) -> list[bool]:
        self._enter("put", keys)
        return self.inner.put(keys, objects)

    def register(self, array: np.ndarray) -> None:
        self._enter("register", ())
        self.inner.register(array)

    def close(self) -> None:
        self.release()
        self.inner.close()

    def _enter(self, method: str, keys: Sequence[str]) -> None:
        with self._lock:
            self.calls[method] += 1
            self.batch_keys.append((method, len(keys)))
        if method in self.stall_on:
            self._released.wait()
        if method in self.raise_on:
            raise InjectedFault(f"injected: {method} failed")

    def _hidden(self, key: str) -> bool:
        return any(f"/{pool}/" in key or f"/{pool}@" in key for pool in self.hidden_pools)


def _damage(kind: str, size: int, header, payload) -> int:
    head = np.frombuffer(memoryview(header).cast("B"), np.uint8)
    body = np.frombuffer(memoryview(payload).cast("B"), np.uint8)
    if kind == "checksum":
        body[body.size // 2] ^= 0x40
    elif kind == "bad_header":
        head[0] ^= 0xFF
    elif kind == "foreign":           # another key of the same length: its last character changed
        last = KEY_OFFSET + int.from_bytes(head[6:8].tobytes(), "little") - 1
        head[last] = ord("0") if head[last] != ord("0") else ord("1")
    elif kind == "truncated":
        return size - 1
    elif kind == "oversize":
        return size + 4096
    else:
        raise ValueError(f"unknown damage {kind!r}; known: {DAMAGE}")
    return size
