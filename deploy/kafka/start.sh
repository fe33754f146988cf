#!/bin/sh
# Format the KRaft storage on first start, then run the broker in the foreground.
set -e
CP='/opt/kafka/libs/*'
if [ ! -f /var/lib/kafka/meta.properties ]; then
    java -Xmx256m -cp "$CP" kafka.tools.StorageTool format --standalone \
        -t "${KAFKA_CLUSTER_ID:-rollstream-compose-01}" -c /opt/kafka/server.properties \
        --ignore-formatted
fi
exec java -Xmx${KAFKA_HEAP:-1g} -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile=/opt/kafka/log4j2.properties \
    -cp "$CP" kafka.Kafka /opt/kafka/server.properties
