"""What a `TransferEngine` offers beside the transfer path: the host tier's rows, read and
written outside any plan (L3 storage, snapshots, tests), and seams to inspect and time its
programs (tests, benchmarks). A mixin of `TransferEngine`: it reads the engine's programs,
host tier and block moves."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import numpy as np

from hicache_jax.layout.rows import RowFormat
from hicache_jax.transfer import compile_cache
from hicache_jax.transfer.programs import AllocatorPrograms, Program


class EngineSeams:
    _programs: dict[str, AllocatorPrograms]

    # -- host tier access (L3 storage, tests) ----------------------------------------------------
    def read_host_rows(self, allocator: str, host_pages) -> np.ndarray:
        """A copy of host rows `host_pages` of `allocator`: `[n, row_elems]` in the packed row
        format (`self.host.formats[allocator]`, all ranks). Blocks."""
        progs = self._allocator(allocator)
        return self._blocks.read_rows(progs, self._blocks.checked_pages(progs, host_pages))

    def write_host_rows(self, allocator: str, host_pages, rows: np.ndarray) -> None:
        """Overwrite host rows `host_pages` of `allocator` with `rows` (`[n, row_elems]`, packed)."""
        progs = self._allocator(allocator)
        self._blocks.write_rows(progs, self._blocks.checked_pages(progs, host_pages), np.asarray(rows))

    def copy_early(self, allocator: str, num_pages: int, host_pages) -> bool:
        """Start copying host pages to the device ahead of their load (see `EarlyCopies.copy_early`)."""
        return self._early.copy_early(allocator, num_pages, host_pages)

    def copy_early_many(self, allocator: str, loads) -> None:
        """`copy_early` for loads planned together, in one program (`EarlyCopies.copy_early_many`)."""
        self._early.copy_early_many(allocator, loads)

    def read_host_page(self, allocator: str, host_page: int) -> dict[str, np.ndarray]:
        """`{pool: [num_layers, *page_shape]}` of one host page, whole pages (all ranks). Blocks."""
        return self._allocator(allocator).fmt.decode(self.read_host_rows(allocator, [host_page])[0])

    def write_host_page(self, allocator: str, host_page: int, pages: Mapping[str, np.ndarray]) -> None:
        """Overwrite one host page with `{pool: [num_layers, *page_shape]}` (whole pages)."""
        self.write_host_rows(allocator, [host_page], self._allocator(allocator).fmt.encode(pages)[None])

    # -- introspection and instrumentation (tests, benchmarks) ------------------------------------
    def on_program_call(self, hook: Callable | None) -> None:
        """From now on, every transfer program this engine runs is called as
        `hook(label, program, *args)`, which calls `program(*args)` (or stands in for it) and
        returns its result: a seam to time, record or replace a program (None: no hook)."""
        for progs in self._programs.values():
            progs.hook = hook
        self._plan_programs.hook = hook

    @staticmethod
    def wait_compiles() -> None:
        """Block until every program compiling on the background thread is ready."""
        compile_cache.wait_background()

    def plan_program(self, backup: bool, runs: tuple[tuple, ...]):
        """The one program that moves a plan whose allocators each move as one chunk: `runs`
        = `((allocator, pages), ...)` for a backup, `((allocator, pages, on device), ...)`
        for a load (as `on_program_call` labels it: "plan:pack[...]" / "plan:load_block[...]"),
        compiled on first use."""
        return self._plan_programs.compiled(backup, tuple(tuple(r) for r in runs))

    def program(self, allocator: str, name: str, *key: int):
        """The compiled program `name` (`Program`) of `allocator` for shape `key`, compiled on first use."""
        return self._allocator(allocator).compiled(Program(name), *key)

    def row_format(self, allocator: str) -> RowFormat:
        """How `allocator`'s host rows are packed."""
        return self._allocator(allocator).fmt

    @property
    def device_pages(self) -> dict[str, int]:
        """Device pages per allocator."""
        return dict(self._device.pages)

    def chunk_pages(self, allocator: str) -> int:
        """Pages per chunk (staging rows) of `allocator`."""
        return self._allocator(allocator).chunk_pages

    def program_jaxprs(self) -> dict[str, object]:
        """Jaxprs of every program compiled so far, by label (for the host-compute check)."""
        return {**{k: v for p in self._programs.values() for k, v in p.jaxprs.items()}, **self._plan_programs.jaxprs}

    def compiled_programs(self) -> dict[str, jax.stages.Compiled]:
        """Every program compiled so far, by the label `on_program_call` gives it (e.g. to
        inspect its HLO): "<allocator>:<program>[<shape key>]", or "plan:..." for a plan's."""
        return {**{f"{a}:{key[0]}{list(key[1:])}": c for a, p in self._programs.items() for key, c in p._cache.items()},
                **self._plan_programs.labelled()}

    # -- internals -------------------------------------------------------------------------
    def _allocator(self, allocator: str) -> AllocatorPrograms:
        if allocator not in self._programs:
            raise ValueError(f"allocator {allocator!r} has no host pool here (allocators with bytes: {sorted(self._programs)})")
        return self._programs[allocator]


