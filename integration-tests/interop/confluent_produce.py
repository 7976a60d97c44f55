"""Writes card authorisations to a topic with Confluent's own Python serializers and registry
client, as a team's producer would: Avro (AvroSerializer), Protobuf (ProtobufSerializer, whose
schema goes to the registry as a serialized descriptor) or JSON Schema (JSONSerializer). Subject by
TopicNameStrategy, the registry's wire format. Prints one JSON line per record: the event as the
processor's event model should read it.

    confluent_produce.py --format avro --bootstrap 127.0.0.1:9092 \
        --registry http://127.0.0.1:8085/apis/ccompat/v7 --topic t --count 100
"""

import argparse
import decimal
import faulthandler
import json
import signal
import sys

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

# Subjects by TopicNameStrategy, named outright. Left unset, confluent-kafka 2.16's serde first asks
# the registry for the topic's "associations" (GET /associations/resources/...), a route Apicurio
# Registry 3.3.3 does not serve; about 1 in 150 of its 404s for an unknown route never reaches
# the client (measured with curl: 8 of 1,200), and the client waited for it forever.
SERDE_CONF = {"subject.name.strategy.type": "TOPIC"}


def registry_client(url):
    """The registry client, each request bounded: a response the registry never sends is retried
    (the client's max.retries) instead of waited on forever."""
    return SchemaRegistryClient({"url": url, "timeout": 10})

AVRO = json.dumps({
    "type": "record", "name": "Authorisation", "namespace": "com.example.cards",
    "fields": [
        {"name": "auth", "type": {"type": "record", "name": "Auth",
                                  "fields": [{"name": "id", "type": "string"}]}},
        {"name": "card", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                    "precision": 12, "scale": 2}},
        {"name": "currency", "type": {"type": "enum", "name": "Currency",
                                      "symbols": ["EUR", "USD"]}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
})

JSON_SCHEMA = json.dumps({
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Authorisation", "type": "object",
    "properties": {
        "auth": {"type": "object", "properties": {"id": {"type": "string"}},
                 "required": ["id"]},
        "card": {"type": "string"},
        "amount_cents": {"type": "integer"},
        "currency": {"enum": ["EUR", "USD"]},
        "note": {"type": ["string", "null"]},
    },
    "required": ["auth", "card", "amount_cents", "currency"],
    "additionalProperties": False,
})


def dump_stacks_on_sigterm():
    """The test runs each script under coreutils `timeout`, whose SIGTERM then prints where every
    thread waits (on stderr, which the test shows) before the process ends."""
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)


def protobuf_message_class():
    """cards.Authorisation, built from its descriptor (no protoc): a nested Auth message, an enum,
    an int64 and a google.protobuf.Timestamp (a well-known import the serializer does not
    register as a reference)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from google.protobuf import timestamp_pb2

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="cards/authorisation.proto", package="cards", syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"])
    message = proto.message_type.add(name="Authorisation")
    auth = message.nested_type.add(name="Auth")
    auth.field.add(name="id", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    currency = message.enum_type.add(name="Currency")
    currency.value.add(name="EUR", number=0)
    currency.value.add(name="USD", number=1)
    message.field.add(name="auth", number=1, type=field.TYPE_MESSAGE,
                      type_name=".cards.Authorisation.Auth", label=field.LABEL_OPTIONAL)
    message.field.add(name="card", number=2, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    message.field.add(name="amount_cents", number=3, type=field.TYPE_INT64,
                      label=field.LABEL_OPTIONAL)
    message.field.add(name="currency", number=4, type=field.TYPE_ENUM,
                      type_name=".cards.Authorisation.Currency", label=field.LABEL_OPTIONAL)
    message.field.add(name="at", number=5, type=field.TYPE_MESSAGE,
                      type_name=".google.protobuf.Timestamp", label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("cards.Authorisation"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=["avro", "protobuf", "json-schema"], required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--registry", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args()
    dump_stacks_on_sigterm()

    registry = registry_client(args.registry)
    context = SerializationContext(args.topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": args.bootstrap, "enable.idempotence": True})
    if args.format == "avro":
        serialize = AvroSerializer(registry, AVRO, conf=SERDE_CONF)
    elif args.format == "json-schema":
        serialize = JSONSerializer(JSON_SCHEMA, registry, conf=SERDE_CONF)
    else:
        Authorisation = protobuf_message_class()
        serialize = ProtobufSerializer(Authorisation, registry,
                                       dict(SERDE_CONF, **{"use.deprecated.format": False}))

    for n in range(args.count):
        event_id, card = f"auth-{n}", f"card-{n % 7}"
        currency = ["EUR", "USD"][n % 2]
        cents = 100 * n + 5
        if args.format == "avro":
            note = None if n % 3 else f"note {n}"
            value = {"auth": {"id": event_id}, "card": card,
                     "amount": decimal.Decimal(cents).scaleb(-2), "currency": currency,
                     "note": note}
            expected = dict(value, amount=f"{decimal.Decimal(cents).scaleb(-2):.2f}")
        elif args.format == "json-schema":
            value = {"auth": {"id": event_id}, "card": card, "amount_cents": cents,
                     "currency": currency, "note": None}
            expected = value
        else:
            value = Authorisation(card=card, amount_cents=cents, currency=n % 2)
            value.auth.id = event_id
            value.at.FromSeconds(1_714_564_800 + n)
            seconds = 1_714_564_800 + n
            expected = {"auth": {"id": event_id}, "card": card, "amount_cents": cents,
                        "currency": currency,
                        "at": _rfc3339(seconds)}
        producer.produce(args.topic, key=card.encode(), value=serialize(value, context))
        producer.poll(0)
        print(json.dumps(expected), flush=True)
    left = producer.flush(30)
    if left:
        sys.exit(f"{left} records not delivered")


def _rfc3339(seconds):
    import datetime
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


if __name__ == "__main__":
    main()
