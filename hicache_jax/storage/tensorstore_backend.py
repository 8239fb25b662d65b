"""L3 on a tensorstore kvstore: embedded (no server), local disk by default.

URLs (the kvstore under the `ocdbt` driver, which packs many small objects into few large
files and commits a batch of writes as one manifest update):

    file:///some/dir                {"driver": "ocdbt", "base": {"driver": "file", "path": "/some/dir/"}}
    file:///some/dir?layout=plain   {"driver": "file", ...}: one file per object, no ocdbt
    file:///some/dir?sync=1         fsync each write (default off, see below)
    gs://bucket/path                {"driver": "ocdbt", "base": "gs://bucket/path/"}
    s3://bucket/path                {"driver": "ocdbt", "base": "s3://bucket/path/"}

Several processes may share one `file://` directory (ocdbt commits are atomic
conditional writes of its manifest) or one bucket. `sync` is off by default: a cache may
lose recent writes in a crash, and an object cut off or torn by one fails its checksum and
reads as a miss, so fsync buys nothing but latency.

tensorstore's Python API takes and returns `bytes`: a put copies header + payload into
one value, a get copies the value into the caller's buffers.
"""
from __future__ import annotations

import time
import urllib.parse
from collections.abc import Sequence

import tensorstore as ts

from hicache_jax.storage.backend import StorageBackend
from hicache_jax.storage.memory_backend import fill

_EMPTY = slice(0, 0)   # a zero-length byte range: presence without reading the value
NO_VALUE = b"\x02"     # tensorstore's generation of an absent key (StorageGeneration::NoValue)


class TensorstoreBackend(StorageBackend):
    """A tensorstore kvstore opened from `spec`. Every wait is bounded by `timeout_s`."""

    def __init__(self, spec: dict | str, timeout_s: float = 5.0, name: str = "tensorstore"):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.name, self.spec, self.timeout_s = name, spec, float(timeout_s)
        self.kvstore = ts.KvStore.open(spec).result(timeout=self.timeout_s)

    @classmethod
    def from_url(cls, url: str, timeout_s: float = 5.0) -> "TensorstoreBackend":
        return cls(url_to_spec(url), timeout_s, name=f"tensorstore:{url}")

    def contains(self, keys: Sequence[str]) -> list[bool]:
        futures = [self.kvstore.read(k, byte_range=_EMPTY) for k in keys]
        return [r.state == "value" for r in self._results(futures)]

    def get(self, keys: Sequence[str], into) -> list[int | None]:
        batch = ts.Batch()   # one batch lets ocdbt read neighbouring objects together
        futures = [self.kvstore.read(k, batch=batch) for k in keys]
        batch.submit()
        out: list[int | None] = []
        for result, (header, payload) in zip(self._results(futures), into, strict=True):
            out.append(fill(result.value, header, payload) if result.state == "value" else None)
        return out

    def put(self, keys: Sequence[str], objects) -> list[bool]:
        # Conditional writes ("only if absent") leave an object another writer stored as it
        # is. Not one transaction: a single present key would abort all of it. Concurrent
        # writes still reach ocdbt together, and it commits them in few manifest updates.
        futures = [self.kvstore.write(k, b"".join((header, memoryview(payload).cast("B"))), if_equal=NO_VALUE)
                   for k, (header, payload) in zip(keys, objects, strict=True)]
        self._results(futures)
        return [True] * len(keys)

    def _results(self, futures) -> list:
        deadline = time.monotonic() + self.timeout_s
        return [f.result(timeout=max(0.0, deadline - time.monotonic())) for f in futures]


def url_to_spec(url: str) -> dict | str:
    """The kvstore spec of a `file://`, `gs://` or `s3://` URL (see the module docstring)."""
    parts = urllib.parse.urlsplit(url)
    options = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - {"layout", "sync"})
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} in storage URL {url!r} (options: layout, sync)")
    layout = options.get("layout", "ocdbt")
    if layout not in ("ocdbt", "plain"):
        raise ValueError(f"layout must be 'ocdbt' or 'plain', got {layout!r} in {url!r}")
    sync = options.get("sync", "0")
    if sync not in ("0", "1"):
        raise ValueError(f"sync must be 0 or 1, got {sync!r} in {url!r}")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError(f"a file URL needs an absolute local path (file:///some/dir), got {url!r}")
        base: dict | str = {"driver": "file", "path": parts.path.rstrip("/") + "/", "file_io_sync": sync == "1"}
    elif parts.scheme in ("gs", "s3"):
        if not parts.netloc:
            raise ValueError(f"a {parts.scheme} URL needs a bucket ({parts.scheme}://bucket/path), got {url!r}")
        if "sync" in options:
            raise ValueError(f"option sync applies to file URLs only, got {url!r}")
        base = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}/"
    else:
        raise ValueError(f"tensorstore storage takes file://, gs:// or s3:// URLs, got {url!r}")
    return {"driver": "ocdbt", "base": base} if layout == "ocdbt" else base
