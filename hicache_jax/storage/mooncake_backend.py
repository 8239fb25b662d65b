"""L3 on Mooncake Store: one store shared by every serving instance that names its master.

URL: `mooncake://host:port` (the `mooncake_master` RPC address), with options

    segment=BYTES     memory this client lends to the store (default 0: it only reads and
                      writes; objects live in the segments of other clients, e.g. the
                      holder `MooncakeServer` starts, and survive this process)
    buffer=BYTES      the client's local transfer buffer (default 16 MiB)
    protocol=tcp      transfer protocol (`tcp`; `rdma` is passed through untested)
    local_host=ADDR   the address other clients reach this one at (default 127.0.0.1
                      for a loopback master, else this host's name)

Moves are zero-copy: `batch_put_from_multi_buffers` / `batch_get_into_multi_buffers`
read the header scratch and the host row where they lie (host tier buffers passed to
`register` are registered with the engine once). The engine bounds its own RPCs (30 s);
the tier's shorter timeout decides when the serving loop stops waiting.

A master that cannot be reached fails fast: a TCP connect to it (bounded by
`connect_timeout_s`) comes before the client starts, whose own setup retries 20 times over
about 90 s and logs each attempt (it reads its retry count only from the environment:
`MC_STORE_CLIENT_SETUP_RETRIES` is set to 1 unless already set). Its log lines (glog)
cannot be turned down from the environment, so a master that is down logs none at all.

Needs the `mooncake` extra (`pip install hicache-jax[mooncake]`, the non-CUDA wheel: only
host memory moves) and `libibverbs.so.1` even over TCP (`apt-get install libibverbs1`).
"""
from __future__ import annotations

import ipaddress
import os
import socket
import threading
import urllib.parse
from collections.abc import Sequence

import numpy as np

from hicache_jax.storage.backend import StorageBackend
from hicache_jax.storage.objects import MissReason

OBJECT_NOT_FOUND = -704   # Mooncake's error codes (mooncake-store types.h)
BUFFER_TOO_SMALL = -600   # a multi-buffer get of an object longer than the buffers
TRANSFER_FAIL = -800      # ... of one shorter than them (or a failed transfer)
DEFAULT_BUFFER_BYTES = 16 << 20


class MooncakeError(RuntimeError):
    """The Mooncake client reported a failure for a whole call."""


def import_store():
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        raise ImportError(
            f"Mooncake storage needs the mooncake extra and libibverbs: `pip install 'hicache-jax[mooncake]'` "
            f"and `apt-get install libibverbs1` ({e})") from e
    return MooncakeDistributedStore


class MooncakeBackend(StorageBackend):
    """A Mooncake Store client connected to the master at `master` ("host:port")."""

    def __init__(self, master: str, *, segment_bytes: int = 0, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                 protocol: str = "tcp", local_host: str | None = None, connect_timeout_s: float = 5.0):
        if protocol not in ("tcp", "rdma"):
            raise ValueError(f"protocol must be 'tcp' or 'rdma', got {protocol!r}")
        host, _, port = master.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"Mooncake master must be 'host:port', got {master!r}")
        for field, value in (("segment_bytes", segment_bytes), ("buffer_bytes", buffer_bytes)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{field} must be an int >= 0, got {value!r}")
        self.name = f"mooncake:{master}"
        self.local_host = local_host or (host if _is_loopback(host) else socket.getfqdn())
        _reach(host, int(port), connect_timeout_s)
        os.environ.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", "1")   # the reach above was the retry
        self.store = import_store()()
        rc = self.store.setup(self.local_host, "P2PHANDSHAKE", segment_bytes, buffer_bytes, protocol, "", master)
        if rc != 0:
            raise MooncakeError(f"Mooncake setup against master {master} failed with code {rc} (is mooncake_master running?)")
        self._registered: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, timeout_s: float = 5.0) -> "MooncakeBackend":
        return cls(**parse_url(url), connect_timeout_s=timeout_s)

    def contains(self, keys: Sequence[str]) -> list[bool]:
        codes = self.store.batch_is_exist(list(keys))
        bad = [c for c in codes if c < 0]
        if bad:
            raise MooncakeError(f"batch_is_exist failed with code {bad[0]} on {len(bad)} of {len(keys)} keys")
        return [c == 1 for c in codes]

    def get(self, keys: Sequence[str], into) -> list[int | None | MissReason]:
        ptrs, sizes = _pointers(into)
        codes = self.store.batch_get_into_multi_buffers(list(keys), ptrs, sizes)
        other = [c for c in codes if c < 0 and c not in (OBJECT_NOT_FOUND, BUFFER_TOO_SMALL, TRANSFER_FAIL)]
        if other:   # the master is unreachable or timed out (RPC errors), or worse: fail the call
            raise MooncakeError(f"batch_get_into_multi_buffers failed with code {other[0]} on {len(other)} "
                                f"of {len(keys)} keys")
        return [self._outcome(k, c, sum(n)) for k, c, n in zip(keys, codes, sizes, strict=True)]

    def put(self, keys: Sequence[str], objects) -> list[bool]:
        headers = np.frombuffer(b"".join(h for h, _ in objects), np.uint8).reshape(len(objects), -1)
        ptrs, sizes = _pointers([(headers[i], payload) for i, (_, payload) in enumerate(objects)])
        codes = self.store.batch_put_from_multi_buffers(list(keys), ptrs, sizes)
        if codes and all(c < 0 for c in codes):   # nothing stored: the store is down or full
            raise MooncakeError(f"batch_put_from_multi_buffers failed on every key (code {codes[0]})")
        return [c == 0 for c in codes]

    def register(self, array: np.ndarray) -> None:
        with self._lock:
            if array.ctypes.data in self._registered:
                return
            rc = self.store.register_buffer(array.ctypes.data, array.nbytes)
            if rc != 0:
                raise MooncakeError(f"register_buffer of {array.nbytes} bytes failed with code {rc}")
            self._registered[array.ctypes.data] = array   # kept alive while registered

    def close(self) -> None:
        with self._lock:
            for ptr in self._registered:
                self.store.unregister_buffer(ptr)
            self._registered.clear()
        self.store.close()

    def _outcome(self, key: str, code: int, expected: int) -> int | None | MissReason:
        if code >= 0:
            return code
        if code == OBJECT_NOT_FOUND:
            return None
        # BUFFER_TOO_SMALL / TRANSFER_FAIL: a multi-buffer get fails unless the object fills
        # the buffers exactly. Ask the object's size (one more call, on this path only) to
        # tell a cut-off or foreign object from a failed transfer.
        size = self.store.get_size(key)
        return size if size >= 0 and size != expected else MissReason.ERROR


def _pointers(pieces) -> tuple[list[list[int]], list[list[int]]]:
    ptrs, sizes = [], []
    for header, payload in pieces:
        arrays = [np.frombuffer(memoryview(b).cast("B"), np.uint8) for b in (header, payload)]
        ptrs.append([a.ctypes.data for a in arrays])
        sizes.append([a.nbytes for a in arrays])
    return ptrs, sizes


def parse_url(url: str) -> dict:
    """`MooncakeBackend`'s arguments from a `mooncake://host:port?...` URL (connects to nothing);
    ValueError naming what is wrong."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "mooncake" or not parts.netloc or parts.path not in ("", "/"):
        raise ValueError(f"a Mooncake URL is mooncake://host:port, got {url!r}")
    host, _, port = parts.netloc.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a Mooncake URL is mooncake://host:port, got {url!r}")
    options = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - {"segment", "buffer", "protocol", "local_host"})
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} in {url!r} (options: segment, buffer, protocol, local_host)")
    args = {"master": parts.netloc, "protocol": options.get("protocol", "tcp"), "local_host": options.get("local_host")}
    if args["protocol"] not in ("tcp", "rdma"):
        raise ValueError(f"option protocol must be 'tcp' or 'rdma', got {args['protocol']!r} in {url!r}")
    for opt in ("segment", "buffer"):
        if opt in options:
            if not options[opt].isdigit():
                raise ValueError(f"option {opt} must be a byte count, got {options[opt]!r} in {url!r}")
            args[f"{opt}_bytes"] = int(options[opt])
    return args


def _reach(host: str, port: int, timeout_s: float) -> None:
    """MooncakeError unless a TCP connection to the master opens within `timeout_s`."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        raise MooncakeError(f"cannot reach mooncake_master at {host}:{port}: "
                            f"{e.strerror or type(e).__name__} (is it running?)") from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
