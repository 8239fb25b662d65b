"""The control plane (layout, allocators, tree, plans, window policy) and the L3 storage tier never import jax."""
import subprocess
import sys

from conftest import ROOT


def test_control_plane_runs_without_jax():
    code = """
import sys
import numpy as np
import hicache_jax as hc
from hicache_jax.tree import TreeCore
from hicache_jax.plan import make_plan
from hicache_jax.alloc import TierAllocators
layout = hc.build_layout(hc.load_model_config('configs/tiny_v4.json'))
core = TreeCore(layout, device_pages={'kv': 4, 'swa': 4}, host_pages={'kv': 8, 'swa': 8})
got = core.alloc_device({'kv': 2, 'swa': 1})
core.insert(np.arange(512, dtype=np.int32), got['kv'], {'swa': {1: int(got['swa'][0])}})
batch = core.take_backup_batch()
core.ack_backup(batch.ack_id)
core.check_invariants()
assert hc.WindowPolicy.parse('ends+every_4').keep_pages(2560, 256, 2) == {2, 3, 6, 7, 8, 9}
from hicache_jax.storage import MemoryBackend, StorageTier, open_backend
import hicache_jax.storage.tensorstore_backend, hicache_jax.storage.mooncake_server
tier = StorageTier(layout, open_backend('memory://'))
pages = tier.page_hashes(np.arange(512))
rows = np.ones((2, tier.rows['kv'].row_bytes), np.uint8)
assert tier.put_pages('kv', pages, rows, [0, 1]).wait(10) and tier.exists_prefix(pages) == 2
tier.close()
assert not [m for m in sys.modules if m == 'jax' or m.startswith('jax.')], 'jax was imported'
print('ok')
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
