#!/usr/bin/env bash
# Install the pinned agent harnesses the harness tests and recipes drive, into clawgym's own npm
# prefix ($CLAWGYM_HOME/harnesses, default ~/.cache/clawgym/harnesses; never global):
#
#   scripts/install-harnesses.sh              # Claude Code and Codex
#   scripts/install-harnesses.sh openclaw     # also OpenClaw with Node 24 (~650 MB)
#
# Versions are pinned in each adapter (src/clawgym/rollout/harnesses/) because harnesses change
# what they send between releases. Idempotent: installed versions are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v npm >/dev/null || { echo "[install-harnesses] npm not found: install node >= 20 first" >&2; exit 1; }
for name in claude-code codex "$@"; do
    if clawgym harness list 2>/dev/null | grep -E "^│ $name +│" | grep -q ready; then
        echo "[install-harnesses] $name: already installed"
    else
        clawgym harness install "$name"
    fi
done
