#!/usr/bin/env bash
# One command: install (with test tools), lint (ruff, config in pyproject.toml), then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh dev
"${PYTHON:-python3}" -m ruff check .
"${PYTHON:-python3}" scripts/check_sizes.py  # no module in specviz/ over 500 lines, no function over 80
exec "${PYTHON:-python3}" -m pytest "$@"
