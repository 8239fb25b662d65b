"""Radix tree core (control plane: pure Python + numpy, never imports jax)."""
from hicache_jax.tree.components import Component, Components
from hicache_jax.tree.core import TreeCore
from hicache_jax.tree.loads import LoadCost
from hicache_jax.tree.match import MatchResult, as_tokens
from hicache_jax.tree.node import NodeId
from hicache_jax.tree.policy import WritePolicy, WritePolicyName
from hicache_jax.tree.results import (AckId, BackupBatch, DropReason, EvictResult, HostCopy, InsertResult, LoadId,
                                      LoadJob, LockId, PrefetchId, PrefetchJob, PrefetchOutcome, Refusal, TransferId,
                                      TreeStats)
from hicache_jax.tree.state import Residency, Tier, TreeStateError

__all__ = ["AckId", "BackupBatch", "Component", "Components", "DropReason", "EvictResult", "HostCopy", "InsertResult",
           "LoadCost", "LoadId", "LoadJob", "LockId", "MatchResult", "NodeId", "PrefetchId", "PrefetchJob",
           "PrefetchOutcome", "Refusal", "Residency", "Tier", "TransferId", "TreeCore", "TreeStateError", "TreeStats",
           "WritePolicy", "WritePolicyName", "as_tokens"]
