#!/usr/bin/env bash
# A Docker engine for the docker sandbox and its tests, on a machine with no registry access:
#   scripts/docker-engine.sh start    install docker.io if dockerd is missing (root, apt), start dockerd
#                                     if no engine answers, build the base image if it is missing
#   scripts/docker-engine.sh status   exit 0 when the engine answers and has the base image
#   scripts/docker-engine.sh stop     stop the dockerd that `start` started (nothing else)
# Idempotent. The engine listens on $DOCKER_HOST (default unix:///var/run/docker.sock) and leaves the
# host's networking alone: no iptables rules, no IP forwarding, no docker0 bridge (sandboxes run
# with --network none). Its state lives in its own data-root, pidfile and exec-root.
# The base image ($CLAWGYM_BASE_IMAGE, default clawgym-base:bookworm) is a Debian minbase made by
# debootstrap from the mirror apt uses (about 2 minutes): bash and coreutils for the agents;
# the runner's Python and the harnesses are mounted in by the sandbox. The rootfs tarball is
# cached, so a rebuild takes seconds. docs/harnesses.md, "Sandboxes".
set -euo pipefail
export DOCKER_HOST="${DOCKER_HOST:-unix:///var/run/docker.sock}"
IMAGE="${CLAWGYM_BASE_IMAGE:-clawgym-base:bookworm}"
STATE=/run/clawgym-docker
PIDFILE="$STATE/dockerd.pid"
DATA=/var/lib/clawgym-docker
CACHE=/var/cache/clawgym-docker
LOG=/var/log/clawgym-dockerd.log
# The shared libraries a Python's extension modules load (ssl, sqlite3, expat, readline, curses, dbm):
# the sandbox runs the runner's own Python in the container, with the image's C libraries.
LIBS=libssl3,libsqlite3-0,libexpat1,libreadline8,libncursesw6,libgdbm6,ca-certificates

say() { echo "[docker-engine] $*"; }
answers() { docker info >/dev/null 2>&1; }
ours() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

apt_lists() {
    # refresh the package lists only when they lack $1; another apt (scripts/install.sh, which CI
    # runs alongside) may hold their lock for a moment
    apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [0-9]' && return
    for _ in 1 2 3 4 5; do apt-get update -qq -o DPkg::Lock::Timeout=300 && return; sleep 10; done
}

install_engine() {
    command -v dockerd >/dev/null && command -v docker >/dev/null && return
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        say "dockerd is not installed; install docker.io (Debian) or Docker Engine as root"; exit 1
    fi
    say "installing docker.io (apt)"
    apt_lists docker.io
    apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends docker.io >/dev/null
}

start_engine() {
    if answers; then say "engine answers on $DOCKER_HOST"; return; fi
    install_engine
    [ "$(id -u)" = 0 ] || { say "starting dockerd needs root"; exit 1; }
    mkdir -p "$STATE" "$DATA"
    # Debian's package enables a systemd unit where systemd runs; here dockerd is started directly.
    say "starting dockerd on $DOCKER_HOST (host networking untouched)"
    nohup dockerd --host "$DOCKER_HOST" --pidfile "$PIDFILE" --data-root "$DATA" --exec-root "$STATE/exec" \
        --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none >>"$LOG" 2>&1 &
    for _ in $(seq 300); do answers && return; sleep 0.1; done
    say "dockerd did not answer within 30 s; see $LOG"; tail -5 "$LOG" >&2; exit 1
}

mirror() {
    # the Debian mirror apt already uses (deb822 or one-line sources), else the default one
    local uri
    uri=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list /etc/apt/sources.list \
          | grep -v security | head -1 | sed -E 's/^URIs: *//; s/^deb (\[[^]]*\] )?//; s/ .*//')
    echo "${uri:-http://deb.debian.org/debian}"
}

build_image() {
    if docker image inspect "$IMAGE" >/dev/null 2>&1; then say "image $IMAGE present"; return; fi
    local tarball="$CACHE/${IMAGE//[:\/]/_}.tar"
    if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null || { say "installing debootstrap (apt)"; apt_lists debootstrap; apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends debootstrap >/dev/null; }
        local dir
        dir=$(mktemp -d /var/tmp/clawgym-rootfs.XXXXXX)
        say "building $IMAGE: debootstrap minbase bookworm from $(mirror)"
        debootstrap --variant=minbase --include="$LIBS" bookworm "$dir" "$(mirror)" >"$CACHE.debootstrap.log" 2>&1 \
            || { say "debootstrap failed; see $CACHE.debootstrap.log"; rm -rf "$dir"; exit 1; }
        rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
        mkdir -p "$CACHE"
        tar -C "$dir" -c . >"$tarball.part" && mv "$tarball.part" "$tarball"
        rm -rf "$dir"
    fi
    docker import - "$IMAGE" <"$tarball" >/dev/null
    say "image $IMAGE built ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}'))"
}

case "${1:-}" in
    start) start_engine; build_image ;;
    status)
        answers || { say "no engine answers on $DOCKER_HOST"; exit 1; }
        docker image inspect "$IMAGE" >/dev/null 2>&1 || { say "engine answers; image $IMAGE missing"; exit 1; }
        say "engine answers on $DOCKER_HOST$(ours && echo ' (started by this script)'); image $IMAGE present" ;;
    stop)
        if ours; then
            pid=$(cat "$PIDFILE"); say "stopping dockerd ($pid)"; kill "$pid"
            for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
            rm -f "$PIDFILE"
        else
            say "no dockerd started by this script is running"
        fi ;;
    *) echo "usage: scripts/docker-engine.sh start|status|stop" >&2; exit 2 ;;
esac
