"""What an L3 engine must offer (`StorageBackend`); `urls.open_backend(url)` picks one.

An object is stored as two pieces laid end to end: the 256-byte header and the payload.
Backends move pieces straight from and into the caller's buffers where the engine allows
(Mooncake: yes; tensorstore takes and returns `bytes`, so one copy each way). Keys are
`ObjectKey.text` strings. Every method is one batched round trip to the engine; the
caller (`StorageTier`) sends at most `MAX_BATCH_PAGES` pages per call and bounds each
call with a timeout, so a backend may block but must not retry forever.

Contract of each method:
- `contains(keys)`: one presence flag per key.
- `exists(keys)`: how many keys from the start are present (the leading run of
  `contains`). Page keys are prefix-closed, so this is the length of a stored prefix.
- `get(keys, into)`: fills `into[i] = (header buffer, payload buffer)` with the object
  under `keys[i]`; returns per key its stored size in bytes, None when absent, or
  `MissReason.ERROR` when the engine failed on that key alone. A size other than
  `len(header) + len(payload)` means the buffers hold no usable data.
- `put(keys, objects)`: stores `objects[i] = (header, payload)` under `keys[i]`; a key
  already present is left as it is. Returns one success flag per key.
- `register(array)`: a hint that `array` (a host tier buffer) will be moved often; an
  engine that needs registered memory for zero-copy moves registers it once.
- `close()`: releases the engine; the backend is unusable afterwards.
Any method may raise: the tier counts it as a backend error and degrades, it never
passes the exception on to the serving loop.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from hicache_jax.storage.objects import MissReason

MAX_BATCH_PAGES = 128   # pages per backend call (each page: one object per pool and rank)


@runtime_checkable
class StorageBackend(Protocol):
    """Batched, content-addressed object store of L3 pages (see the module docstring)."""

    name: str

    def contains(self, keys: Sequence[str]) -> list[bool]: ...

    def exists(self, keys: Sequence[str]) -> int:
        flags = self.contains(keys)
        return next((i for i, present in enumerate(flags) if not present), len(flags))

    def get(self, keys: Sequence[str], into: Sequence[tuple[memoryview, memoryview]]) -> list[int | None | MissReason]:
        ...

    def put(self, keys: Sequence[str], objects: Sequence[tuple[bytes, memoryview]]) -> list[bool]: ...

    def register(self, array: np.ndarray) -> None:
        return None

    def close(self) -> None:
        return None


def as_bytes(array: np.ndarray) -> np.ndarray:
    """A uint8 view of a C-contiguous array (bf16 and other ml_dtypes have no buffer format)."""
    if not array.flags.c_contiguous:
        raise ValueError(f"storage buffers must be C-contiguous, got strides {array.strides}")
    return array.reshape(-1).view(np.uint8)
