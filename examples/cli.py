"""Flag checks the examples make before any work starts.

A bad flag ends the run with one line on stderr, `prog: error: ...` naming the flag and
its value, exit status 2, and nothing written: no output file is created to find out
whether it can be, and tiers that would not fit the memory they live in are refused
before anything is allocated.
"""
from __future__ import annotations

import argparse
import os
import pathlib

import jax

import hicache_jax as hc
from hicache_jax.layout.rows import RowFormat

ROOT = pathlib.Path(__file__).resolve().parents[1]


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block): `prog: error: message`."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def config_path(path: str) -> pathlib.Path:
    """`path`, or where a relative path not found here lies in the repository."""
    config = pathlib.Path(path)
    if not config.exists() and not config.is_absolute() and (ROOT / config).exists():
        return ROOT / config
    return config


def load_layout(ap: argparse.ArgumentParser, flag: str, path: str) -> hc.PoolLayout:
    """The layout of the model config at `path` (see `config_path`); a missing, unreadable
    or invalid file is an error naming it."""
    where = config_path(path)
    try:
        return hc.build_layout(hc.load_model_config(where))
    except (OSError, ValueError) as e:
        message = e.strerror if isinstance(e, OSError) else str(e).removeprefix(f"{where}: ")
        ap.error(f"{flag} {path}: {message}")


def check_range(ap: argparse.ArgumentParser, args: argparse.Namespace, limits: dict) -> None:
    """`limits`: {attribute: (lowest, highest or None)}; an error names the first flag outside."""
    for name, (lo, hi) in limits.items():
        value = getattr(args, name)
        if value < lo or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"in {lo}..{hi}"
            ap.error(f"--{name.replace('_', '-')} must be {bound}, got {value}")


def check_writable(ap: argparse.ArgumentParser, flag: str, path: str | None) -> None:
    """An error unless `path` can be written at the end of the run (creates nothing)."""
    if not path:
        return
    target = pathlib.Path(path)
    parent = target.parent if str(target.parent) else pathlib.Path(".")
    if target.is_dir():
        ap.error(f"{flag} {path}: is a directory")
    if target.exists():
        if not os.access(target, os.W_OK):
            ap.error(f"{flag} {path}: cannot write there (permission denied)")
    elif not parent.is_dir():
        ap.error(f"{flag} {path}: cannot write there (no directory {parent})")
    elif not os.access(parent, os.W_OK | os.X_OK):
        ap.error(f"{flag} {path}: cannot write there (directory {parent} is not writable)")


def check_memory(ap: argparse.ArgumentParser, layout: hc.PoolLayout, config: hc.HiCacheConfig,
                 flags: dict[str, str]) -> None:
    """An error naming the flag when the device pools would not fit the device's memory, or
    the host tier its limit or the machine's memory. `flags`: {"device": "--device-pages N",
    "host": "--host-pages N"}."""
    device, host = config.page_counts(layout)
    gib = lambda n: f"{n / 2**30:,.2f} GiB"
    device_bytes = sum(layout.page_bytes_of(a) * n for a, n in device.items() if layout.moving_with(a))
    host_bytes = sum(RowFormat.create(layout, a, 1, config.transfer.layer_groups).stored_row_bytes * n
                     for a, n in host.items() if layout.moving_with(a))
    ram = available_memory_bytes()
    limit, where = device_memory_bytes()
    if device_bytes > limit:
        ap.error(f"{flags['device']}: the device pools need {gib(device_bytes)}, more than {where} ({gib(limit)})")
    try:
        host_limit = config.transfer.host_limit_bytes()
    except ValueError as e:     # a malformed XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB
        ap.error(str(e))
    if host_bytes > host_limit:
        ap.error(f"{flags['host']}: the host tier needs {gib(host_bytes)} of pinned memory, more than XLA's pinned "
                 f"pool allows ({gib(host_limit)}: XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB)")
    on_host = host_bytes + (device_bytes if jax.devices()[0].platform == "cpu" else 0)
    if ram is not None and on_host > ram:
        what = "the host tier" + (" and the device pools (CPU)" if on_host > host_bytes else "")
        ap.error(f"{flags['host']}: {what} need {gib(on_host)}, more than this machine's available memory "
                 f"({gib(ram)})")


def device_memory_bytes() -> tuple[int, str]:
    """(bytes, what they are) the first device may hold: its allocator's limit, or on the CPU
    the machine's available memory."""
    device = jax.devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"the memory of {device.device_kind}"
    ram = available_memory_bytes()
    return (ram if ram is not None else 1 << 62), "this machine's available memory (the device is the CPU)"


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
