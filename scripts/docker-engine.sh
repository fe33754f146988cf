#!/usr/bin/env bash
# A Docker engine for the Docker sandbox backend and its tests, from Debian packages only:
# install docker.io where it is missing, start dockerd without a bridge network (containers run
# with --network none), and build the local base image from Debian packages (debootstrap, then
# docker import), skipped when the image exists. Needs root for each step it has to take; as
# another user it says what is missing and exits 0 so `make deps` goes on.
set -euo pipefail

IMAGE="${ROLLSTREAM_BASE_IMAGE:-rollstream/base:bookworm}"
SUITE="${ROLLSTREAM_BASE_SUITE:-bookworm}"
STATE_DIR="${ROLLSTREAM_DOCKER_STATE:-/var/lib/rollstream-docker}"
LOG="$STATE_DIR/dockerd.log"

note() { echo "docker-engine: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
    if docker info >/dev/null 2>&1; then
        docker image inspect "$IMAGE" >/dev/null 2>&1 \
            || note "the engine runs but $IMAGE is missing; run 'make deps' as root to build it"
    else
        note "no Docker engine reachable; run 'make deps' as root to install and start one"
    fi
    exit 0
fi

apt_install() {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

command -v dockerd >/dev/null 2>&1 || apt_install docker.io \
    || { note "could not install docker.io (Docker tests will skip)"; exit 0; }
mkdir -p "$STATE_DIR"

if ! docker info >/dev/null 2>&1; then
    note "starting dockerd (log: $LOG)"
    setsid nohup dockerd --bridge=none --iptables=false --ip6tables=false >>"$LOG" 2>&1 &
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || { note "dockerd did not start (Docker tests will skip); see $LOG"; tail -20 "$LOG" >&2; exit 0; }
fi

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    note "$IMAGE exists"
    exit 0
fi
command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap \
    || { note "could not install debootstrap (Docker tests will skip)"; exit 0; }
ROOTFS="$(mktemp -d "$STATE_DIR/rootfs.XXXXXX")"
trap 'rm -rf "$ROOTFS"' EXIT
note "building $IMAGE from Debian $SUITE packages"
# Tests run with the task's own tools: bash, git, patch and Python with pytest.
debootstrap --variant=minbase --include=python3,python-is-python3,python3-pytest,git,patch,procps \
    "$SUITE" "$ROOTFS" >"$STATE_DIR/debootstrap.log" 2>&1 \
    || { note "debootstrap failed (Docker tests will skip); see $STATE_DIR/debootstrap.log"; tail -20 "$STATE_DIR/debootstrap.log" >&2; exit 0; }
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
    -c 'CMD ["bash"]' - "$IMAGE" >/dev/null
note "built $IMAGE"
