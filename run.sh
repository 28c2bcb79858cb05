#!/usr/bin/env bash
# One command: install, then start the web app on the embedded default pair.
# Extra arguments go to app.py (e.g. --port 8080, --quantize int8).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
exec "${PYTHON:-python3}" app.py "$@"
