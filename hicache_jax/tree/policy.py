"""The write policy: one object that answers every question the paths ask about backups."""
from __future__ import annotations

import dataclasses

from hicache_jax import validate
from hicache_jax.config import WritePolicyName
from hicache_jax.tree.results import DropReason

_DEFAULT_THRESHOLD = {WritePolicyName.WRITE_THROUGH: 1, WritePolicyName.WRITE_THROUGH_SELECTIVE: 2,
                      WritePolicyName.WRITE_BACK: None}


@dataclasses.dataclass(frozen=True)
class WritePolicy:
    """When device pages get a host copy, and what happens to pages that have none.

    `threshold`: hits after which a node is backed up (None: never on a hit). Write-through
    policies keep the backed-up set closed under "parent" (a backup first backs up the
    node's unbacked ancestors, and a failed backup takes the host copies below it back);
    write-back backs a node up when it is evicted from the device, and drops it (counted as
    host pressure) only when the host has no room. `host=False` (a cache with no host
    tier): nothing is ever backed up, and an evicted node is dropped as `NO_HOST_TIER`.
    """

    name: WritePolicyName
    threshold: int | None
    host: bool = True

    @classmethod
    def create(cls, name: str, threshold: int | None = None, host: bool = True) -> "WritePolicy":
        try:
            policy = WritePolicyName(name)
        except ValueError:
            raise ValueError(f"unknown write_policy {name!r}; one of {[p.value for p in WritePolicyName]}") from None
        if threshold is not None:
            threshold = validate.count("write_threshold", threshold, minimum=1)
        return cls(policy, threshold if threshold is not None else _DEFAULT_THRESHOLD[policy], host)

    def backs_up_on_hit(self, hit_count: int) -> bool:
        return self.host and self.threshold is not None and hit_count >= self.threshold

    @property
    def backs_up_on_eviction(self) -> bool:
        """An unbacked device leaf is backed up (and demoted) instead of dropped."""
        return self.host and self.name is WritePolicyName.WRITE_BACK

    @property
    def closed_under_parent(self) -> bool:
        """Every node with a host copy has a parent with one (write-through policies)."""
        return self.name is not WritePolicyName.WRITE_BACK

    @property
    def drop_reason(self) -> DropReason:
        """Why an unbacked device leaf that is evicted loses its data."""
        if not self.host:
            return DropReason.NO_HOST_TIER
        return DropReason.HOST_PRESSURE if self.backs_up_on_eviction else DropReason.WRITE_THROUGH_UNBACKED_EVICTION
