#!/usr/bin/env bash
# Install clawgym (editable) with the given extras, e.g. `scripts/install.sh dev`.
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
