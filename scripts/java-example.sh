#!/usr/bin/env bash
# Build the Java example (examples/java) and write its classpath to target/classpath.txt:
# offline first, since Maven's cache usually holds its jars; the first build fetches them.
# `make deps` runs it, so the interop test finds it built; the test runs it again only when a
# source is newer than the build. Usage: scripts/java-example.sh [LOG]
set -euo pipefail
cd "$(dirname "$0")/../examples/java"
log=${1:-/dev/null}
goals=(compile dependency:build-classpath -Dmdep.outputFile="$PWD/target/classpath.txt")
mvn -q -B -o "${goals[@]}" >>"$log" 2>&1 || mvn -q -B "${goals[@]}" >>"$log" 2>&1
