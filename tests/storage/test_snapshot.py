"""orbax snapshots of host buffers plus metadata: what was saved comes back, where asked."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import make_single_device_sharding

from hicache_jax.storage import load_snapshot, save_snapshot


def buffers():
    rng = np.random.default_rng(0)
    return {"kv": rng.integers(0, 256, (8, 1024), dtype=np.uint8),
            "gqa": rng.standard_normal((4, 512)).astype(jnp.bfloat16)}


def test_numpy_buffers_and_metadata_round_trip(tmp_path):
    bufs, meta = buffers(), {"tree": {"nodes": [[0, 1, [3, 4]]], "page_size": 256}, "model": "tiny_v4"}
    save_snapshot(tmp_path / "s", bufs, meta)
    snap = load_snapshot(tmp_path / "s")
    assert snap.metadata == meta
    for name, a in bufs.items():
        assert isinstance(snap.buffers[name], np.ndarray) and snap.buffers[name].dtype == a.dtype
        assert snap.buffers[name].tobytes() == a.tobytes()


def test_empty_buffers_round_trip_beside_others_or_alone(tmp_path):
    """orbax stores no zero-size array: the metadata carries their shape and dtype."""
    pinned = make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    save_snapshot(tmp_path / "s", {**buffers(), "tokens": np.zeros(0, np.int32)}, {"n": 0})
    snap = load_snapshot(tmp_path / "s", shardings={"tokens": pinned})
    assert snap.buffers["tokens"].shape == (0,) and snap.buffers["tokens"].sharding == pinned
    assert snap.buffers["kv"].tobytes() == buffers()["kv"].tobytes()
    save_snapshot(tmp_path / "t", {"tokens": np.zeros((0, 3), np.uint16)}, {"n": 0})
    snap = load_snapshot(tmp_path / "t")
    assert snap.buffers["tokens"].shape == (0, 3) and snap.buffers["tokens"].dtype == np.uint16
    assert snap.metadata == {"n": 0}


def test_pinned_host_arrays_restore_into_pinned_host(tmp_path):
    pinned = make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    bufs = {k: jax.device_put(v, pinned) for k, v in buffers().items()}
    save_snapshot(tmp_path / "s", bufs, {})
    snap = load_snapshot(tmp_path / "s", shardings={"kv": pinned})
    assert snap.buffers["kv"].sharding == pinned
    assert np.asarray(snap.buffers["kv"]).tobytes() == np.asarray(bufs["kv"]).tobytes()
    assert isinstance(snap.buffers["gqa"], np.ndarray)     # not named: numpy


def test_snapshot_errors_name_the_problem(tmp_path):
    save_snapshot(tmp_path / "s", buffers(), {})
    with pytest.raises(ValueError, match="exists"):
        save_snapshot(tmp_path / "s", buffers(), {})
    save_snapshot(tmp_path / "s", {"kv": np.zeros(3, np.uint8)}, {"n": 1}, overwrite=True)
    assert load_snapshot(tmp_path / "s").metadata == {"n": 1}
    with pytest.raises(ValueError, match="JSON"):
        save_snapshot(tmp_path / "t", buffers(), {"bad": object()})
    with pytest.raises(ValueError, match="no snapshot"):
        load_snapshot(tmp_path / "missing")
    with pytest.raises(ValueError, match="lacks"):
        load_snapshot(tmp_path / "s", shardings={"swa": make_single_device_sharding(jax.devices()[0])})
