#!/bin/sh
# Format the KRaft storage on first start, then run the broker in the foreground.
# KAFKA_PORT, KAFKA_CONTROLLER_PORT and KAFKA_ADVERTISED_HOST move the listeners (the local
# compose override runs on the host's network, where 9092 may be taken).
set -e
CP='/opt/kafka/libs/*'
CONF=/tmp/server.properties
sed -e "s/:9092/:${KAFKA_PORT:-9092}/g" -e "s/:9093/:${KAFKA_CONTROLLER_PORT:-9093}/g" \
    -e "s#PLAINTEXT://kafka:#PLAINTEXT://${KAFKA_ADVERTISED_HOST:-kafka}:#" \
    /opt/kafka/server.properties >"$CONF"
if [ ! -f /var/lib/kafka/meta.properties ]; then
    java -Xmx256m -cp "$CP" kafka.tools.StorageTool format --standalone \
        -t "${KAFKA_CLUSTER_ID:-rollstream-compose-01}" -c "$CONF" --ignore-formatted
fi
exec java -Xmx${KAFKA_HEAP:-1g} -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile=/opt/kafka/log4j2.properties \
    -cp "$CP" kafka.Kafka "$CONF"
