# One image for api, worker and beat. On GPU hosts the torch==2.13.0 pin resolves to the CUDA
# build from PyPI; the rest of the project installs on top of it.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
# bubblewrap: workers run every job's ranks in a sandbox (workers/isolation/sandbox.py); nftables: the
# jobs that keep the network are fenced off the control plane (workers/isolation/netfence.py).
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap nftables \
    && rm -rf /var/lib/apt/lists/*
RUN pip install "torch==2.13.0"
COPY pyproject.toml README.md ./
COPY api api
COPY core core
COPY workers workers
COPY trainer trainer
COPY jobspec jobspec
COPY dataformat dataformat
COPY torchyard torchyard
COPY migrations migrations
COPY demos demos
COPY alembic.ini ./
RUN pip install -e ".[all,s3]"
EXPOSE 8000
CMD ["torchyard", "api", "--host", "0.0.0.0", "--port", "8000"]
