# syntax=docker/dockerfile:1
#
# One image per tier, from one Dockerfile (docs/deployment.md, "Images per tier"):
#
#   API (also migrate and keys): the `api` extra, no torch and no GPU stack
#     docker build --target api -t omniqueue:api .          (the default target)
#   Worker, CPU:
#     docker build --target worker -t omniqueue:worker .
#   Worker, CUDA (GPU):
#     docker build --target worker -t omniqueue:cuda \
#       --build-arg BASE=nvidia/cuda:12.4.1-base-ubuntu22.04 \
#       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124 .
#
# The CUDA wheels of torch bundle the CUDA runtime, cuDNN and cuBLAS, so the small
# ``-base-`` CUDA image is enough; the host only needs the NVIDIA driver and the NVIDIA
# Container Toolkit. A ``-cudnn-runtime-`` base works too, it is just larger.

ARG BASE=python:3.11-slim

# The project's files, copied once for both tiers.
FROM scratch AS source
COPY pyproject.toml README.md /app/
COPY api /app/api
COPY workers /app/workers
COPY realtime /app/realtime
COPY storage /app/storage
COPY models /app/models
COPY migrations /app/migrations
COPY cli /app/cli

# Python 3.11 in a venv, and the runtime user; shared by both tiers.
FROM ${BASE} AS python

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# python:3.11-slim already has Python 3.11; the CUDA (Ubuntu 22.04) base gets it from apt.
# Everything else (PyAV's FFmpeg, libpq for psycopg) ships inside the wheels.
RUN set -eux; \
    if ! command -v python3.11 >/dev/null 2>&1; then \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            python3.11 python3.11-venv ca-certificates; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3.11 -m venv "$VIRTUAL_ENV"; \
    python -m pip install --upgrade pip

# Non-root runtime user with a writable home (caches) and data directory.
RUN set -eux; \
    groupadd --system --gid 10001 omniqueue; \
    useradd --system --uid 10001 --gid omniqueue --create-home --home-dir /home/omniqueue \
        --shell /usr/sbin/nologin omniqueue; \
    install -d -o omniqueue -g omniqueue /var/lib/omniqueue
ENV OMNIQ_DATA_DIR=/var/lib/omniqueue
WORKDIR /app
ENTRYPOINT ["omniqueue"]

# ---- worker: torch (CPU or CUDA build) + the `worker` and `diffusers` extras -------------
FROM python AS worker

# Where ``pip install torch`` looks first: .../whl/cpu or .../whl/cu124.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Which torch to take from that index (pyproject requires torch>=2.4).
ARG TORCH_SPEC="torch>=2.4"

# torch first, from the index that matches the base (its own, cached layer).
RUN pip install --index-url "${TORCH_INDEX}" "${TORCH_SPEC}"

COPY --from=source /app /app
# torch is already satisfied, so this only adds the rest of the dependencies.
RUN set -eux; \
    pip install '.[worker,speech,diffusers]'; \
    rm -rf build ./*.egg-info; \
    python -c "import torch; print('torch', torch.__version__)"

# Numeric, so Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
# Workers serve no HTTP, so no HEALTHCHECK.
CMD ["worker"]

# ---- api (the default target): the `api` extra; building it fails if torch came in ------
FROM python AS api

COPY --from=source /app /app
RUN set -eux; \
    pip install '.[api]'; \
    rm -rf build ./*.egg-info; \
    python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)"

USER 10001:10001

EXPOSE 8000

# No HEALTHCHECK here: docker-compose.yml probes the api's /ready.
CMD ["api", "--host", "0.0.0.0", "--port", "8000"]
