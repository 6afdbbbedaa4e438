# syntax=docker/dockerfile:1
# trainguard's images, one target per deployable (docker-compose.yml builds each):
#   trainer      the demo trainer and `trainguard logs-setup`: CPU torch + [instrumentation,logs]
#   exporter     the node exporter: [exporter] (nvidia-ml-py, no torch)
#   remediation  the remediation service: [remediation] (FastAPI, no torch)
# Each target installs its extra into its own virtualenv in a build stage and copies only
# that virtualenv into a slim runtime, so the exporter and remediation images never contain torch.
# All three run as the same unprivileged user (uid 10001): in the compose stack the exporter
# and the remediation service share the trainer's PID namespace and read its processes'
# /proc/<pid>/environ (and the service signals them), which needs the same uid.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS source
WORKDIR /src
# The whole distribution (.dockerignore keeps out tests, virtualenvs, caches and secrets).
COPY . .

# ---------------------------------------------------------------------------------------------
FROM source AS build-trainer
# The CPU build of torch, pinned like the Makefile's TORCH_SPEC, from PyTorch's CPU index so
# that pip never pulls the multi-GB CUDA wheels; GPU images pass a CUDA index instead.
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}" \
    && /opt/venv/bin/pip install --no-cache-dir -c constraints.txt ".[instrumentation,logs]"

FROM source AS build-exporter
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -c constraints.txt ".[exporter]"

FROM source AS build-remediation
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -c constraints.txt ".[remediation]"

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 trainguard \
    && useradd --system --uid 10001 --gid trainguard --home-dir /var/lib/trainguard \
       --create-home --shell /usr/sbin/nologin trainguard
WORKDIR /var/lib/trainguard

# ---------------------------------------------------------------------------------------------
FROM runtime AS trainer
COPY --from=build-trainer /opt/venv /opt/venv
COPY deploy/docker/trainer-entrypoint.sh /usr/local/bin/trainer-entrypoint
WORKDIR /app
# The integration examples, runnable as `examples/<name>.py` beside the installed package.
COPY examples/ examples/
RUN install -d -o trainguard -g trainguard /var/log/trainguard /var/lib/trainguard/file_sd \
       /var/lib/trainguard/checkpoints /var/lib/trainguard/dumps
USER 10001:10001
# Rank metrics on 9400 + local rank.
EXPOSE 9400 9401
ENTRYPOINT ["trainer-entrypoint"]
CMD ["torchrun", "--nnodes", "1", "--nproc-per-node", "2", "-m", "trainguard.demo.train", \
     "--checkpoint-dir", "/var/lib/trainguard/checkpoints"]

FROM runtime AS exporter
COPY --from=build-exporter /opt/venv /opt/venv
USER 10001:10001
EXPOSE 9835
HEALTHCHECK --interval=15s --timeout=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9835/metrics', timeout=4)"]
ENTRYPOINT ["trainguard-exporter"]

FROM runtime AS remediation
COPY --from=build-remediation /opt/venv /opt/venv
RUN install -d -o trainguard -g trainguard /var/lib/trainguard/remediation
USER 10001:10001
ENV TRAINGUARD_REMEDIATION_HOST=0.0.0.0 \
    TRAINGUARD_REMEDIATION_DB_PATH=/var/lib/trainguard/remediation/remediation.db
EXPOSE 9095
HEALTHCHECK --interval=10s --timeout=5s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9095/readyz', timeout=4)"]
ENTRYPOINT ["trainguard-remediation"]
