"""Reads a topic with Confluent's own Python deserializers and registry client, as a team's
consumer would: Avro (AvroDeserializer, by the writer's schema id), Protobuf (ProtobufDeserializer
with the cards.Authorisation class confluent_produce.py writes) or JSON Schema (JSONDeserializer).
read_committed, from the beginning, until `--count` records are read or `--timeout` seconds pass.
Prints one JSON line per record: {"event_id": its event_id header, "value": the record as
confluent_produce.py prints the event it wrote}.

    confluent_consume.py --format avro --bootstrap 127.0.0.1:9092 \
        --registry http://127.0.0.1:8085/apis/ccompat/v7 --topic t --count 100
"""

import argparse
import json
import sys
import time
import uuid

from confluent_kafka import Consumer
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from confluent_produce import (JSON_SCHEMA, SERDE_CONF, _rfc3339, dump_stacks_on_sigterm,
                               protobuf_message_class, registry_client)


def deserializer(fmt, registry):
    """The format's deserializer, and how its value becomes the printed event."""
    if fmt == "avro":
        def avro_event(value):
            return dict(value, amount=f"{value['amount']:.2f}")
        return AvroDeserializer(registry, conf=SERDE_CONF), avro_event
    if fmt == "json-schema":
        return JSONDeserializer(JSON_SCHEMA, schema_registry_client=registry,
                                conf=SERDE_CONF), lambda value: value
    authorisation = protobuf_message_class()

    def protobuf_event(message):
        return {"auth": {"id": message.auth.id}, "card": message.card,
                "amount_cents": message.amount_cents,
                "currency": ["EUR", "USD"][message.currency],
                "at": _rfc3339(message.at.seconds)}
    return ProtobufDeserializer(authorisation,
                                dict(SERDE_CONF, **{"use.deprecated.format": False})), protobuf_event


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=["avro", "protobuf", "json-schema"], required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--registry", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    dump_stacks_on_sigterm()

    registry = registry_client(args.registry)
    deserialize, event = deserializer(args.format, registry)
    context = SerializationContext(args.topic, MessageField.VALUE)
    consumer = Consumer({"bootstrap.servers": args.bootstrap,
                         "group.id": f"confluent-consume-{uuid.uuid4()}",
                         "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([args.topic])
    read, deadline = 0, time.monotonic() + args.timeout
    try:
        while read < args.count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                sys.exit(f"consumer error: {message.error()}")
            headers = dict(message.headers() or [])
            event_id = (headers.get("event_id") or b"").decode()
            value = event(deserialize(message.value(), context))
            print(json.dumps({"event_id": event_id, "value": value}), flush=True)
            read += 1
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
