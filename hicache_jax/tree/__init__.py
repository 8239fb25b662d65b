"""Radix tree core (control plane: pure Python + numpy, never imports jax)."""
from hicache_jax.tree.core import TreeCore
from hicache_jax.tree.match import MatchResult, as_tokens
from hicache_jax.tree.node import NodeId
from hicache_jax.tree.policy import (BackupBatch, DropReason, EvictResult, InsertResult, LoadJob, LockId, Refusal,
                                     WritePolicy)
from hicache_jax.tree.state import Residency, TreeStateError

__all__ = ["BackupBatch", "DropReason", "EvictResult", "InsertResult", "LoadJob", "LockId", "MatchResult", "NodeId",
           "Refusal", "Residency", "TreeCore", "TreeStateError", "WritePolicy", "as_tokens"]
