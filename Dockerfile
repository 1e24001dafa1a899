# The clawgym runtime image: Python, Node (for the npm-installed harnesses) and the toolkit.
# CPU by default; on GPU hosts build FROM a CUDA base and install the matching torch first.
# BASE names the base image: any Debian bookworm image, e.g. the registry's python:3.11-slim-bookworm
# (default) or, with no registry in reach, the one scripts/docker-engine.sh makes locally:
#   docker build --network host --build-arg BASE=clawgym-base:bookworm -t clawgym .
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false

# Node 20 from Debian for the harness CLIs (OpenClaw needs Node >= 24: `clawgym harness install`
# fetches it from npm into its own prefix); bubblewrap for sandbox isolation; git for harnesses.
# Python and venv from Debian where the base has none (a plain Debian base); the toolkit goes into
# a venv either way, which Debian's own Python requires (PEP 668).
RUN apt-get update \
    && apt-get install -y --no-install-recommends nodejs npm bubblewrap git ca-certificates procps \
    && (python3 -c 'import ensurepip, venv' 2>/dev/null || apt-get install -y --no-install-recommends python3 python3-venv) \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /opt/clawgym
COPY pyproject.toml README.md ./
COPY src ./src
COPY scripts ./scripts
# The CPU torch wheel first (an unpinned torch would pull CUDA), via the project's own installer.
# EXTRAS picks optional parts, e.g. `docker build --build-arg EXTRAS=ray -t clawgym-ray .` for the
# Ray head and worker image of docs/scale.md.
ARG EXTRAS=""
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
    && scripts/install.sh "$EXTRAS"

RUN useradd --create-home clawgym
USER clawgym
WORKDIR /home/clawgym
CMD ["clawgym", "--help"]
