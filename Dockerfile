# The clawgym runtime image: Python, Node (for the npm-installed harnesses) and the toolkit.
# CPU by default; on GPU hosts build FROM a CUDA base and install the matching torch first.
# BASE names the base image: any Debian bookworm image, e.g. the registry's python:3.11-slim-bookworm
# (default) or, with no registry in reach, the one scripts/docker-engine.sh makes locally.
#   docker build -t clawgym .                 pip installs from the package index
#   scripts/docker-image.sh [TAG] [EXTRAS]    the host's pip fills a wheelhouse (build/wheels) and the
#                                             image installs from it alone, on the local base
ARG BASE=python:3.11-slim-bookworm

# Stage 1: the toolkit in a venv. Python and venv from Debian where the base has none (a plain Debian
# base); the toolkit goes into a venv either way, which Debian's own Python requires (PEP 668).
FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN (python3 -c 'import ensurepip, venv' 2>/dev/null \
        || (apt-get update && apt-get install -y --no-install-recommends python3 python3-venv)) \
    && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /opt/clawgym
COPY pyproject.toml README.md ./
COPY src ./src
COPY scripts ./scripts
# The wheelhouse, when there is one: the glob matches nothing on a plain checkout, and pyproject.toml
# keeps the COPY valid then (pip's --find-links skips files that are not packages).
COPY pyproject.toml build/wheel[s] /opt/wheels/
# NO_INDEX=1 (scripts/docker-image.sh) installs from the wheelhouse alone, with no network in the
# build. The CPU torch wheel first (an unpinned torch would pull CUDA), then the project's installer.
# EXTRAS picks optional parts, e.g. `--build-arg EXTRAS=ray` for the Ray image of docs/scale.md.
ARG EXTRAS=""
ARG NO_INDEX=""
RUN export PIP_FIND_LINKS=/opt/wheels ${NO_INDEX:+PIP_NO_INDEX=1} \
    && pip install --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
    && CLAWGYM_NO_APT=1 scripts/install.sh "$EXTRAS" \
    && find /opt/venv -name __pycache__ -prune -exec rm -rf {} +

# Stage 2: the runtime. Node from Debian (18 on bookworm) for the harness CLIs (OpenClaw needs Node >= 24:
# `clawgym harness install` fetches it from npm into its own prefix); bubblewrap for sandbox
# isolation; git for harnesses. The venv and the package come from stage 1, without the wheelhouse.
FROM ${BASE}
ENV PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false
RUN apt-get update \
    && apt-get install -y --no-install-recommends nodejs npm bubblewrap git ca-certificates procps \
    && (python3 -c 'import venv' 2>/dev/null || apt-get install -y --no-install-recommends python3) \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/clawgym /opt/clawgym
ENV PATH=/opt/venv/bin:$PATH
RUN useradd --create-home clawgym
# The recipes and their task sets, in the user's home and theirs, so `clawgym run recipes/quickstart.toml`
# runs as it does in a checkout and writes its run beside the recipe (recipes/runs/; mount a volume
# there to keep it). The local sandbox's bubblewrap needs the flags in the README's "Docker" section.
COPY --chown=clawgym:clawgym recipes /home/clawgym/recipes
USER clawgym
WORKDIR /home/clawgym
CMD ["clawgym", "--help"]
