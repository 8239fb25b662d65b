"""Start and stop a loopback Mooncake Store: `mooncake_master` plus one segment holder.

A Mooncake store keeps objects in memory that clients lend it ("segments"); a client's
segment goes away with the client. So that objects outlive the serving processes that
wrote them (a second process, a restart), `MooncakeServer` starts a holder next to the
master: the wheel's `mooncake_client` service lending `segment_bytes`; serving processes
connect with `segment=0` (the default of `MooncakeBackend`).

    with MooncakeServer.start(segment_bytes=1 << 30) as server:
        backend = open_backend(server.url)          # mooncake://127.0.0.1:<port>

For tests, benchmarks and examples; both binaries ship in the `mooncake` extra's wheel.
Each listens on free loopback ports only; logs go to `log_dir`.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import socket
import subprocess
import tempfile
import time

READY_TIMEOUT_S = 30.0


@dataclasses.dataclass
class MooncakeServer:
    """A running master and holder; `stop()` (or leaving the `with` block) ends both."""

    host: str
    port: int
    log_dir: str
    processes: list[subprocess.Popen]

    @property
    def url(self) -> str:
        return f"mooncake://{self.host}:{self.port}"

    @classmethod
    def start(cls, segment_bytes: int = 1 << 30, host: str = "127.0.0.1", log_dir: str | None = None) -> "MooncakeServer":
        if not isinstance(segment_bytes, int) or segment_bytes <= 0:
            raise ValueError(f"segment_bytes must be a positive int, got {segment_bytes!r}")
        log_dir = log_dir or tempfile.mkdtemp(prefix="mooncake-")
        port, metrics_port, holder_port = free_ports(host, 3)
        server = cls(host, port, log_dir, [])
        try:
            server._spawn("mooncake_master", [
                f"--rpc_address={host}", f"--rpc_port={port}", f"--metrics_host={host}",
                f"--metrics_port={metrics_port}", "--enable_metric_reporting=false"])
            server._wait_listening(port)
            server._spawn("mooncake_client", [
                f"--master_server_address={host}:{port}", "--metadata_server=P2PHANDSHAKE", f"--host={host}",
                f"--port={holder_port}", f"--global_segment_size={segment_bytes}", "--protocol=tcp"])
            server._wait_listening(holder_port)   # it listens once its segment is mounted
        except BaseException:
            server.stop()
            raise
        return server

    def stop(self) -> None:
        """Stop the holder, then the master (SIGTERM, SIGKILL after 5 s). Idempotent."""
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.processes.clear()

    def __enter__(self) -> "MooncakeServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _spawn(self, binary: str, args: list[str]) -> None:
        log = open(os.path.join(self.log_dir, f"{binary}.log"), "w")
        with log:
            self.processes.append(subprocess.Popen([binary_path(binary), *args], stdout=log,
                                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    def _wait_listening(self, port: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        proc = self.processes[-1]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with code {proc.returncode}; see {self.log_dir}")
            try:
                socket.create_connection((self.host, port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{proc.args[0]} did not listen on {self.host}:{port} within {READY_TIMEOUT_S} s; "
                           f"see {self.log_dir}")


def binary_path(name: str) -> str:
    """A binary shipped inside the `mooncake` package of the wheel."""
    spec = importlib.util.find_spec("mooncake")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("Mooncake needs the mooncake extra: pip install 'hicache-jax[mooncake]'")
    path = os.path.join(list(spec.submodule_search_locations)[0], name)
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{name} is not in the mooncake wheel at {path}")
    return path


def free_ports(host: str, count: int) -> list[int]:
    """`count` distinct ports free on `host` now (held open together so they differ)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
