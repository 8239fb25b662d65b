"""Rows of a host array as an array of their own, without a copy: a DLPack view.

`jax.device_put` of a whole pinned-host array is one DMA on the copy engines, but XLA reads
a slice of one (`dynamic_slice` in a jit) with a kernel over PCIe, whose speed depends on
the machine (BENCHMARKS.md: 0.60 to 0.96 of the link). `rows_view(block, start, stop)`
hands jax the rows as a DLPack tensor that points into the block (`byte_offset`), with a
deleter that keeps the block alive until jax frees the view. jax takes a CUDA-host tensor
as a `pinned_host` array on the GPU (a CPU tensor as a CPU array), so moving the view to the
device is one DMA of exactly those rows.

Only DLPack's unversioned ABI (`dltensor` capsules) is built here; jax 0.11 and 0.12 take it.
The host tier's loads move parts of blocks of at least `TransferConfig.view_bytes` this way
(BENCHMARKS.md: views against kernel reads).
"""
from __future__ import annotations

import ctypes

import jax
import numpy as np


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

ALIGNMENT = 64                              # bytes: where jax's buffers (and so a view's rows) must start
_CODES = {"i": 0, "u": 1, "f": 2}           # DLPack's kDLInt, kDLUInt, kDLFloat (bfloat16: 4)
_LIVE: dict[int, tuple] = {}                # address of a managed tensor -> what it must keep alive


@_DELETER
def _release(managed, forget=_LIVE.pop, address=ctypes.addressof) -> None:
    # bound at import: jax may free a view while the interpreter is clearing module globals
    forget(address(managed.contents), None)


_capsule = ctypes.pythonapi.PyCapsule_New
_capsule.restype = ctypes.py_object
_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _dtype(dtype: np.dtype) -> _DType:
    if dtype.name == "bfloat16":
        return _DType(4, 16, 1)
    if dtype.kind not in _CODES:
        raise ValueError(f"rows_view: dtype {dtype} has no DLPack code here")
    return _DType(_CODES[dtype.kind], dtype.itemsize * 8, 1)


class _Rows:
    """What `jax.dlpack.from_dlpack` takes: `__dlpack__` and `__dlpack_device__`."""

    def __init__(self, block: jax.Array, pointer: int, offset: int, rows: int):
        self._device = block.__dlpack_device__()
        shape = (ctypes.c_int64 * block.ndim)(rows, *block.shape[1:])
        managed = _Managed()
        managed.dl_tensor = _Tensor(pointer, _Device(int(self._device[0]), self._device[1]),
                                    block.ndim, _dtype(np.dtype(block.dtype)), shape, None, offset)
        managed.deleter = _release
        _LIVE[ctypes.addressof(managed)] = (managed, shape, block)
        self._capsule = _capsule(ctypes.addressof(managed), b"dltensor", None)

    def __dlpack__(self, stream=None, max_version=None, **_):
        return self._capsule

    def __dlpack_device__(self):
        return self._device


def rows_view(block: jax.Array, start: int, stop: int) -> jax.Array:
    """Rows [start, stop) of `block` (one device's array, rows on axis 0, contiguous) as an
    array that shares its memory."""
    if not 0 <= start < stop <= block.shape[0]:
        raise ValueError(f"rows_view: rows [{start}, {stop}) are not inside a block of {block.shape[0]} rows")
    pointer, row_bytes = block.unsafe_buffer_pointer(), block.nbytes // block.shape[0]
    if (pointer + start * row_bytes) % ALIGNMENT:
        raise ValueError(f"rows_view: row {start} of a block of {row_bytes} B rows does not "
                         f"start on {ALIGNMENT} B (jax shares only aligned memory)")
    return jax.dlpack.from_dlpack(_Rows(block, pointer, start * row_bytes, stop - start), copy=False)


def block_view(block: tuple[jax.Array, ...], row: int, rows: int,
               min_bytes: int | None = 0) -> tuple[jax.Array, ...] | None:
    """Rows [row, row + rows) of a host block (one array per part) as a block of its own in
    the block's memory kind, or None where a part is spread over several devices, or where
    the rows hold fewer than `min_bytes` (`TransferConfig.view_bytes`; None: always None).
    On a GPU the view shares the block's memory; on the CPU, which takes host memory as the
    device's, it is copied into the block's memory kind (a host memcpy)."""
    if not viewable(block, rows, min_bytes):
        return None
    views = (rows_view(part, row, row + rows) for part in block)
    return tuple(v if v.sharding.memory_kind == part.sharding.memory_kind else jax.device_put(v, part.sharding)
                 for v, part in zip(views, block))


def viewable(block: tuple[jax.Array, ...], rows: int, min_bytes: int | None) -> bool:
    """Whether `block_view` gives a view of `rows` rows of `block`: each part on one device,
    and the rows holding at least `min_bytes` (None: never)."""
    return (min_bytes is not None and all(len(part.sharding.device_set) == 1 for part in block)
            and rows * sum(part.nbytes // part.shape[0] for part in block) >= min_bytes)


def check_views(sharding: jax.sharding.Sharding) -> None:
    """ValueError unless a view of a host array on `sharding` (one device) lands in its
    memory kind without a copy; the CPU copies (`block_view`) and passes, and so does a
    sharding over several devices (its blocks are never viewed)."""
    if len(sharding.device_set) != 1:
        return
    device = next(iter(sharding.device_set))
    block = jax.device_put(np.zeros((2, ALIGNMENT), np.uint8), sharding)
    view = rows_view(block, 1, 2)
    if device.platform != "cpu" and view.sharding.memory_kind != sharding.memory_kind:
        raise ValueError(f"TransferConfig.view_bytes: this runtime takes a view of {sharding.memory_kind} "
                         f"memory as {view.sharding.memory_kind!r} memory on {device}; set view_bytes=None")


def live_views() -> int:
    """Views jax has not freed yet (for tests: none should outlive their arrays)."""
    return len(_LIVE)
