"""What `HiCache` hands back to a serving loop: named, immutable results."""
from __future__ import annotations

import dataclasses

import numpy as np

from hicache_jax.plan import Direction
from hicache_jax.tree import LockId, NodeId, Refusal, TransferId


@dataclasses.dataclass(frozen=True, eq=False)
class LoadBack:
    """The outcome of `load_back`.

    Started: `length` tokens are usable once `wait(...)` (or a `step()` reporting
    `"load:<load_id>"`) says it landed, and `lock` pins them, from the start, until the
    caller's `unlock(lock)`: whatever else the loop does meanwhile, `device_pages` (anchor
    pages of the whole prefix) and `swa_pages` (SWA pages of its trailing window) stay
    what they say. If the load fails, unlock it and use the match's device prefix.
    Refused: nothing was taken and `lock` is None; the match's device prefix is what
    there is (`device_pages`, `swa_pages`, `node` are the match's).
    A deferred load (`load_back(match, deferred=True)`) leaves one whole anchor block of a
    landing size to the model's next step: `landing` (None when nothing was left), see
    `Landing`.
    """

    load_id: int | None
    refused: Refusal | None
    length: int
    loaded_tokens: int
    device_pages: np.ndarray
    swa_pages: np.ndarray
    node: NodeId
    lock: LockId | None = None
    landing: object | None = None    # hicache_jax.Landing (imports jax: not named here)

    @property
    def started(self) -> bool:
        return self.refused is None


@dataclasses.dataclass(frozen=True, eq=False)
class Prefix:
    """A prompt's usable cached prefix, pinned on device until `cache.unlock(prefix.lock)`.

    `length` tokens (page-aligned) whose anchor pages are `device_pages` and whose trailing
    window's SWA pages are `swa_pages`; `device_tokens` of them were already on device,
    `host_tokens` were loaded back, and of those `storage_tokens` had just been fetched
    from the storage tier. `refused` says why a host hit was not loaded, if so.
    With `acquire(..., deferred=True)` the load is still in flight: `landing` (a
    `Landing`, or None when nothing is left to a step) goes into the model's next step;
    from `acquire_many`, every request whose load is in that transfer holds the same one,
    landed once for all of them.
    """

    length: int
    device_pages: np.ndarray
    swa_pages: np.ndarray
    lock: LockId
    device_tokens: int
    host_tokens: int
    refused: Refusal | None = None
    storage_tokens: int = 0
    landing: object | None = None    # hicache_jax.Landing


@dataclasses.dataclass(frozen=True)
class StepReport:
    """What one `step()` did: tokens of the backups it dispatched, and the transfers that
    ended, by id (`TransferId(Direction.LOAD, lb.load_id)` is a load-back; str: "load:7")."""

    dispatched_backup_tokens: int
    completed: tuple[TransferId, ...]   # backups, loads and storage prefetches that completed this step
    failed: tuple[TransferId, ...]      # the same for transfers that failed or timed out

    def loaded(self, load_id: int) -> bool:
        """Whether load-back `load_id` completed in this step."""
        return TransferId(Direction.LOAD, load_id) in self.completed
