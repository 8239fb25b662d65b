"""The layout inspector CLI, and that the control plane never imports jax."""
import subprocess
import sys

from conftest import CONFIGS, ROOT


def run(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_layout_import_does_not_import_jax():
    code = (
        "import sys, hicache_jax as hc\n"
        "layout = hc.build_layout(hc.load_model_config('configs/tiny_v4.json'))\n"
        "layout.bytes_per_token(); layout.window_bytes_per_token()\n"
        "import hicache_jax.layout.__main__\n"
        "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if m.startswith('jax'))\n"
        "print('ok')\n"
    )
    r = run("-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_cli_prints_pool_table_and_host_bytes():
    r = run("-m", "hicache_jax.layout", str(CONFIGS / "deepseek_v4_flash.json"), "--tokens", "1000000")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for name in ("kv", "swa", "deepseek_v4_c4", "deepseek_v4_c4_indexer", "deepseek_v4_c128",
                 "deepseek_v4_c4_state", "deepseek_v4_c4_indexer_state"):
        assert f"\n{name} " in out
    assert "149,760" in out and "37,440" in out and "1,728" in out
    assert "3,899.25 B/token" in out
    # 1,000,000 tokens -> 3,907 pages x 998,208 B = 3.63 GiB
    assert "3,907 pages" in out and "3.63 GiB" in out


def test_cli_bad_config_is_a_clear_error(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"model_type": "deepseek_v4"}')
    r = run("-m", "hicache_jax.layout", str(p))
    assert r.returncode == 2
    assert "config field 'num_hidden_layers' is missing" in r.stderr
