"""The shape the code keeps (README, "Architecture"): library files of at most 300 lines,
constructors with a handful of collaborators, and outside code (examples, benchmarks) that
goes through the public API, never a private name of the package."""
import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = sorted((ROOT / "hicache_jax").rglob("*.py")) + sorted((ROOT / "pallas_kernels").rglob("*.py"))
OUTSIDE = sorted((ROOT / "examples").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_library_files_stay_short(path):
    lines = path.read_text().count("\n")
    assert lines <= 300, f"{path.relative_to(ROOT)} has {lines} lines"


def _is_dataclass(cls: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(d) or "NamedTuple" in ast.unparse(d) for d in cls.decorator_list) \
        or any("NamedTuple" in ast.unparse(b) for b in cls.bases)


def test_no_constructor_takes_more_than_eight_parameters():
    wide = []
    for path in LIBRARY:
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            if _is_dataclass(cls):
                continue
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                    a = fn.args
                    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) - 1      # without self
                    if n > 8:
                        wide.append(f"{path.relative_to(ROOT)}:{cls.name} ({n})")
    assert not wide, wide


# a private attribute of the package's objects, or a private name imported from it
_PRIVATE = re.compile(r"\b(cache|engine|hc|hicache_jax|core|tree|host)\._[a-z]\w*|from hicache_jax[\w.]* import[^\n]*\b_[a-z]")


@pytest.mark.parametrize("path", OUTSIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_and_benchmarks_use_no_private_name(path):
    text = path.read_text()
    found = sorted({m.group(0) for m in _PRIVATE.finditer(text)})
    assert not found, found
    assert not re.search(r"\bcache\.(core|engine)\b", text)
