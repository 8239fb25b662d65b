#!/usr/bin/env bash
# Set up hicache-jax in ./.venv and run the main example.
#   ./setup.sh            set up, then run the main example
#   ./setup.sh --no-run   set up only
#   --cpu | --cuda12 | --cuda13 | --tpu   which jax build to install (default: detected, see below)
#   --with-mooncake-deps   also apt-get install libibverbs1 (as root) when it is missing: Mooncake's
#                          client loads libibverbs.so.1 even over TCP, so without it the Mooncake
#                          storage backend (mooncake://) is off and its tests skip. Nothing else
#                          is installed outside .venv, and nothing at all without this flag.
# Finds a Python >= 3.12 by itself: python3.13/python3.12/python3 on PATH, then pyenv.
# jax build: with an NVIDIA driver (nvidia-smi), the CUDA build its CUDA version supports
# (13.x: cuda13, 12.x: cuda12); otherwise the CPU build. It prints what it chose.
set -euo pipefail
cd "$(dirname "$0")"

RUN=1 BUILD="" MOONCAKE_DEPS=0
for arg in "$@"; do
  case "$arg" in
    --no-run) RUN=0 ;;
    --cpu|--cuda12|--cuda13|--tpu) BUILD="${arg#--}" ;;
    --with-mooncake-deps) MOONCAKE_DEPS=1 ;;
    *) echo "setup.sh: unknown option $arg (--no-run, --cpu, --cuda12, --cuda13, --tpu, --with-mooncake-deps)" >&2
       exit 2 ;;
  esac
done

detect_build() {
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi >/dev/null 2>&1; then
    echo "cpu no NVIDIA GPU found (nvidia-smi)"; return
  fi
  local cuda gpu
  cuda="$(nvidia-smi | grep -o 'CUDA Version: [0-9]*' | grep -o '[0-9]*$' || true)"
  gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
  if [ -n "$cuda" ] && [ "$cuda" -ge 13 ]; then echo "cuda13 $gpu, driver supports CUDA $cuda"
  elif [ -n "$cuda" ] && [ "$cuda" -eq 12 ]; then echo "cuda12 $gpu, driver supports CUDA $cuda"
  else echo "cpu $gpu, but its driver supports CUDA ${cuda:-?} (jax needs 12 or 13): update the driver"
  fi
}

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
# Mooncake (the mooncake extra, L3 on Mooncake Store) loads libibverbs.so.1 even over TCP.
# A system package: installed only when asked for (--with-mooncake-deps).
if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then
  if [ "$MOONCAKE_DEPS" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup.sh: installing libibverbs1 (apt-get, --with-mooncake-deps) for Mooncake"
    { apt-get install -y -q libibverbs1 || { apt-get update -q && apt-get install -y -q libibverbs1; }; } >/dev/null 2>&1 \
      || echo "setup.sh: apt-get could not install libibverbs1: Mooncake storage is off and its tests skip" >&2
  elif [ "$MOONCAKE_DEPS" = 1 ]; then
    echo "setup.sh: --with-mooncake-deps needs root and apt-get; install libibverbs1 by hand: Mooncake storage" \
         "is off and its tests skip until then" >&2
  else
    echo "setup.sh: libibverbs.so.1 is missing, which Mooncake's client loads even over TCP: Mooncake storage" \
         "(mooncake://) is off and its tests skip. To have it: apt-get install libibverbs1, or ./setup.sh" \
         "--with-mooncake-deps (as root)" >&2
  fi
fi
if [ -z "$BUILD" ]; then
  read -r BUILD WHY <<<"$(detect_build)"
else
  WHY="asked for"
fi
EXTRAS="test,bench,storage,mooncake,gemma"
if [ "$BUILD" != cpu ]; then EXTRAS="$EXTRAS,$BUILD"; fi
echo "setup.sh: installing the $BUILD build of jax ($WHY): .[$EXTRAS]"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[$EXTRAS]"
.venv/bin/python -c 'import jax, hicache_jax; print("setup.sh: jax", jax.__version__, "on", jax.devices()[0].platform)'
if [ "$BUILD" != cpu ] && [ "$(.venv/bin/python -c 'import jax; print(jax.default_backend())')" = cpu ]; then
  echo "setup.sh: warning: installed the $BUILD build, but jax runs on the CPU" >&2
fi

if [ "$RUN" = 1 ]; then
  # the main example: tiny DeepSeek V4 served through the cache, checked against recompute
  .venv/bin/python examples/decode.py --config configs/tiny_v4.json
fi
