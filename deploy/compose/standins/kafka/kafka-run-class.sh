#!/bin/bash
# Runs a Kafka tool's main class with the image's jars (the stand-in has no Kafka distribution
# scripts; this is the part of kafka-run-class.sh the compose file's commands need).
set -euo pipefail
exec java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties -Dkafka.root.level=WARN \
    -cp '/opt/kafka/libs/*' "$@"
