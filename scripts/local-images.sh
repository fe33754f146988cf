#!/usr/bin/env bash
# The local images of docker-compose.local.yml, built with no registry or package index reachable
# from the builds (see deploy/*/Dockerfile): staged parts under .rollstream/images (the Java
# runtime the bundled broker runs on, Debian's Prometheus binary), then `docker build` (cached).
# Without a Docker engine or the base image it says so and exits 0: the compose test skips.
set -euo pipefail

BASE="${ROLLSTREAM_BASE_IMAGE:-rollstream/base:bookworm}"
STAGE=.rollstream/images
note() { echo "local-images: $*" >&2; }

if ! docker info >/dev/null 2>&1; then
    note "no Docker engine reachable; skipped"; exit 0
fi
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    note "$BASE is missing (make deps as root builds it); skipped"; exit 0
fi
for tool in java prometheus; do
    command -v "$tool" >/dev/null 2>&1 || { note "$tool is missing (make deps); skipped"; exit 0; }
done

mkdir -p "$STAGE"
java_home="$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")"
if [ "$(cat "$STAGE/jre.from" 2>/dev/null)" != "$java_home" ]; then
    rm -rf "$STAGE/jre" && mkdir -p "$STAGE/jre"
    tar -C "$java_home" -chf - --exclude=./jmods --exclude=./include --exclude=./docs \
        --exclude=./lib/src.zip . | tar -C "$STAGE/jre" -xf -
    echo "$java_home" >"$STAGE/jre.from"
fi
cmp -s "$(command -v prometheus)" "$STAGE/prometheus" || cp "$(command -v prometheus)" "$STAGE/prometheus"

build() {
    local out
    out="$(docker build --build-arg "BASE=$BASE" -t "$1" -f "$2" . 2>&1)" \
        || { echo "$out" >&2; note "building $1 failed"; exit 1; }
    note "$1 built"
}
build rollstream/kafka:local deploy/kafka/Dockerfile
build rollstream/prometheus:local deploy/prometheus/Dockerfile
build rollstream/app:local deploy/rollstream/Dockerfile
