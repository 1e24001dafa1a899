# The clawgym runtime image: Python, Node (for the npm-installed harnesses) and the toolkit.
# CPU by default; on GPU hosts build FROM a CUDA base and install the matching torch first.
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false

# Node 20 from Debian for the harness CLIs (OpenClaw needs Node >= 24: `clawgym harness install`
# fetches it from npm into its own prefix); bubblewrap for sandbox isolation; git for harnesses.
RUN apt-get update \
    && apt-get install -y --no-install-recommends nodejs npm bubblewrap git ca-certificates procps \
    && rm -rf /var/lib/apt/lists/*

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
