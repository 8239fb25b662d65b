"""Storage URLs: which backend a URL names (`open_backend`), and whether it is well formed
(`check_url`, which opens nothing). Engines are imported only when a URL names them."""
from __future__ import annotations

import urllib.parse

from hicache_jax.storage.backend import StorageBackend

SCHEMES = {
    "file": "tensorstore (ocdbt over local files)",
    "gs": "tensorstore (ocdbt over Google Cloud Storage)",
    "s3": "tensorstore (ocdbt over S3)",
    "mooncake": "Mooncake Store (mooncake_master at host:port)",
    "memory": "in-process dict (tests)",
}


def open_backend(url: str, timeout_s: float = 5.0) -> StorageBackend:
    """The backend a URL names: `file:///dir`, `gs://bucket/path`, `s3://bucket/path`,
    `mooncake://host:port` or `memory://`. Options go in the query string (see each backend).

    `timeout_s` bounds each engine wait of backends that can bound their own waits (for
    Mooncake, the connect to its master).
    """
    if not isinstance(url, str):
        raise ValueError(f"storage URL must be a str, got {type(url).__name__}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("file", "gs", "s3"):
        from hicache_jax.storage.tensorstore_backend import TensorstoreBackend
        return TensorstoreBackend.from_url(url, timeout_s=timeout_s)
    if parts.scheme == "mooncake":
        from hicache_jax.storage.mooncake_backend import MooncakeBackend
        return MooncakeBackend.from_url(url, timeout_s)
    if parts.scheme == "memory":
        from hicache_jax.storage.memory_backend import MemoryBackend
        return MemoryBackend()
    check_url(url)   # raises: the scheme is unknown
    raise AssertionError(f"bug: check_url accepted {url!r}, which open_backend cannot open")


def check_url(url: str) -> None:
    """ValueError unless `url` names a backend `open_backend` knows, with valid options;
    opens and connects to nothing."""
    if not isinstance(url, str):
        raise ValueError(f"storage URL must be a str, got {type(url).__name__}")
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme in ("file", "gs", "s3"):
        from hicache_jax.storage.tensorstore_backend import url_to_spec
        url_to_spec(url)
    elif scheme == "mooncake":
        from hicache_jax.storage.mooncake_backend import parse_url
        parse_url(url)
    elif scheme != "memory":
        known = ", ".join(f"{s}:// ({what})" for s, what in SCHEMES.items())
        raise ValueError(f"unknown storage URL scheme {scheme!r} in {url!r}; known: {known}")
