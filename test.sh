#!/usr/bin/env bash
# One command: install (with test tools), then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh dev
exec "${PYTHON:-python3}" -m pytest "$@"
