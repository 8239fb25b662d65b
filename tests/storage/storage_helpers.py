"""Helpers of the L3 tests: layouts, random host rows, a loopback Mooncake store.

(Not a conftest.py: a second one would shadow `tests/conftest.py` for `from conftest import`.)"""
import os

import numpy as np
import pytest

import hicache_jax as hc
from conftest import CONFIGS

# Mooncake's C++ client logs every call at INFO on stderr; warnings and errors are enough.
os.environ.setdefault("MC_LOG_LEVEL", "WARNING")


def mooncake_unavailable() -> str | None:
    """Why Mooncake tests cannot run here (None: they can). CI sets HICACHE_REQUIRE_MOONCAKE=1
    where it installed the extra and libibverbs, so there a broken install fails instead."""
    try:
        import mooncake.store  # noqa: F401
    except ImportError as e:
        if os.environ.get("HICACHE_REQUIRE_MOONCAKE") == "1":
            raise
        return f"the mooncake extra is not installed or not loadable: {e}"
    return None


needs_mooncake = pytest.mark.skipif(mooncake_unavailable() is not None, reason=str(mooncake_unavailable()))


def start_mooncake(log_dir):
    """A loopback master + holder; the caller stops it."""
    from hicache_jax.storage import MooncakeServer
    return MooncakeServer.start(segment_bytes=512 << 20, log_dir=str(log_dir))


def load_layout(name: str):
    return hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))


def random_rows(row_layout, num_rows: int, seed: int = 0, dtype=np.uint8) -> np.ndarray:
    """Host rows of random bytes (the rows' padding zero, as a host tier keeps it)."""
    rng = np.random.default_rng(seed)
    rows = np.zeros((num_rows, row_layout.row_bytes), np.uint8)
    for seg in row_layout.spans:
        rows[:, seg.offset:seg.offset + seg.nbytes] = rng.integers(0, 256, (num_rows, seg.nbytes), dtype=np.uint8)
    return rows.view(dtype)


def random_tokens(num_pages: int, seed: int = 0, page_size: int = 256) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 50_000, num_pages * page_size + 3).astype(np.int32)
