"""Every benchmark explains itself: `--help` works and every flag has help text."""
import ast
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py")
                 if "add_argument" in p.read_text() or "__main__" in p.read_text())


def test_every_flag_has_help_text():
    missing = []
    for path in SCRIPTS:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" \
                    and not any(k.arg == "help" for k in node.keywords):
                missing.append(f"{path.name}:{node.lineno} {ast.unparse(node.args[0]) if node.args else ''}")
    assert not missing, missing


@pytest.mark.parametrize("path", [p for p in SCRIPTS if "__main__" in p.read_text()], ids=lambda p: p.name)
def test_help_runs(path):
    r = subprocess.run([sys.executable, str(path), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "usage:" in r.stdout and "Traceback" not in r.stderr, r.stderr[-2000:]
