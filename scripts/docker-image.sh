#!/usr/bin/env bash
# Build the clawgym image on a machine whose pip reaches packages the build could not (a local
# wheelhouse, a proxy's CA, a private index): this host's pip fills build/wheels with every wheel
# the image installs, and the Dockerfile installs from there alone.
#   scripts/docker-image.sh [TAG] [EXTRAS]     TAG defaults to clawgym, EXTRAS to none
# The base is $CLAWGYM_BASE_IMAGE (default clawgym-base:bookworm, made by scripts/docker-engine.sh);
# the build reaches the Debian mirror for Node and bubblewrap. The host's Python must be the base's
# minor version (wheels are per version): Debian bookworm's 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-clawgym}"
extras="${2:-}"
base="${CLAWGYM_BASE_IMAGE:-clawgym-base:bookworm}"
export DOCKER_HOST="${DOCKER_HOST:-unix:///var/run/docker.sock}"

say() { echo "[docker-image] $*"; }
command -v docker >/dev/null || { say "docker is not installed: scripts/docker-engine.sh start"; exit 1; }
docker image inspect "$base" >/dev/null 2>&1 || { say "base image $base missing: scripts/docker-engine.sh start"; exit 1; }
want=$(docker run --rm --network none "$base" sh -c 'python3 -c "import sys; print(*sys.version_info[:2], sep=chr(46))" 2>/dev/null || echo 3.11')
have=$(python3 -c 'import sys; print(*sys.version_info[:2], sep=".")')
[ "$want" = "$have" ] || { say "this host's Python is $have, the base's is $want: wheels would not fit"; exit 1; }

target="."
[ -n "$extras" ] && target=".[${extras}]"
# The wheelhouse depends on what pyproject.toml asks for and the extras: a stamp of both skips the
# resolve on a rebuild, so an unchanged build is a cache hit throughout.
stamp="$(sha256sum pyproject.toml | cut -c1-16)-${extras:-none}"
if [ "$(cat build/wheels/.stamp 2>/dev/null)" != "$stamp" ]; then
    say "wheelhouse build/wheels: $target with torch==2.13.0 (this host's pip)"
    rm -rf build/wheels && mkdir -p build/wheels
    python3 -m pip wheel --quiet --disable-pip-version-check -w build/wheels "torch==2.13.0" "$target" setuptools wheel
    rm -f build/wheels/clawgym-*.whl   # the image installs the package from its source, editable
    echo "$stamp" >build/wheels/.stamp
fi
say "docker build $tag on $base"
docker build --network host --build-arg BASE="$base" --build-arg EXTRAS="$extras" --build-arg NO_INDEX=1 -t "$tag" .
say "built $tag: docker run --rm $tag clawgym --help"
