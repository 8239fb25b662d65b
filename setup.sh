#!/usr/bin/env bash
# Set up hicache-jax in ./.venv and run the main example.
#   ./setup.sh            set up, then run the main example
#   ./setup.sh --no-run   set up only
# Finds a Python >= 3.12 by itself: python3.13/python3.12/python3 on PATH, then pyenv.
set -euo pipefail
cd "$(dirname "$0")"

ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; }

find_python() {
  for c in python3.14 python3.13 python3.12 python3; do
    if command -v "$c" >/dev/null && ok "$(command -v "$c")"; then command -v "$c"; return; fi
  done
  if command -v pyenv >/dev/null; then
    for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9]|[2-9][0-9])(\.|$)' | sort -V -r); do
      p="$(pyenv root)/versions/$v/bin/python"
      if [ -x "$p" ] && ok "$p"; then echo "$p"; return; fi
    done
  fi
  return 1
}

if [ ! -x .venv/bin/python ] || ! ok .venv/bin/python; then
  PY="$(find_python)" || { echo "setup.sh: no Python >= 3.12 found (install one, e.g. 'pyenv install 3.12')" >&2; exit 1; }
  echo "setup.sh: creating .venv with $PY ($("$PY" --version))"
  rm -rf .venv
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test,bench,gemma]'
.venv/bin/python -c 'import jax, hicache_jax; print("setup.sh: jax", jax.__version__, "on", jax.devices()[0].platform)'

if [ "${1:-}" != "--no-run" ]; then
  # the main example: tiny DeepSeek V4 served through the cache, checked against recompute
  .venv/bin/python examples/decode.py --config configs/tiny_v4.json
fi
