#!/usr/bin/env bash
# One command: install (with test tools), lint (ruff, config in pyproject.toml), then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh dev
"${PYTHON:-python3}" -m ruff check .
exec "${PYTHON:-python3}" -m pytest "$@"
