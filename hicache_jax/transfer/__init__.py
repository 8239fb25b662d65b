"""Data plane: the transfer engine between device pools and the pinned host tier."""
from hicache_jax.transfer.engine import TransferEngine
from hicache_jax.transfer.handle import Handle, TransferHandle
from hicache_jax.transfer.host_check import host_compute_violations, hlo_host_ops
from hicache_jax.transfer.landing import LandingSchedule, Landing, step_compiler_options

__all__ = ["Handle", "LandingSchedule", "Landing", "TransferEngine", "TransferHandle", "hlo_host_ops", "host_compute_violations",
           "step_compiler_options"]
