#!/usr/bin/env python3
"""Property tests of the eos-suite chart's rendered manifests: what carries the guarantee.

Renders the chart with `helm template` for the default values and every values file in
eos-suite/ci/, then asserts on the manifests: each processor/sink replica's instance id is its
pod name (so distinct per replica and stable across restarts), outbox-relay is one StatefulSet pod
whose name (its position's key and transactional.id) is a fixed value that no upgrade changes,
payments-api publishes to the processor's input, every container has probes, pods run as
non-root with a read-only root filesystem and no capabilities, the migration Job is a
pre-install/pre-upgrade hook that runs every service's schema step before anything else, bad
values (test-values/) fail the render with a message that says what to change, and the optional
monitoring resources ship what deploy/prometheus/check tests: the PrometheusRule is the rules file
as it is, its `up` rules select the jobs the ServiceMonitor produces, and each Grafana dashboard is
a ConfigMap the dashboard sidecar loads.

Run alone:  HELM=/path/to/helm python3 deploy/helm/chart_test.py -v
(needs PyYAML; deploy/helm/check runs it with everything installed). HELM defaults to `helm`,
KUBE_VERSION (the version rendered for) to 1.37.0.
"""

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import unittest
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
CHART = HERE / "eos-suite"
HELM = os.environ.get("HELM", "helm")
KUBE_VERSION = os.environ.get("KUBE_VERSION", "1.37.0")
RELEASE = "rel"

# Values files that must fail to render, and what the error must say.
BAD_VALUES = {
    "misspelt-key.yaml": "additional properties 'replica' not allowed",
    "grace-too-short.yaml": "must be longer than processor.transactionTimeoutSeconds",
    "no-database-secret.yaml": "set database.existingSecret",
    "relay-grace-too-short.yaml": "must be longer than outboxRelay.transactionTimeoutSeconds",
    "payments-api-without-relay.yaml": "paymentsApi.enabled needs outboxRelay.enabled",
    "processor-replicas-above-partitions.yaml": "processor.replicas (4) is more than partitions (3)",
    "sink-replicas-above-partitions.yaml": "sink.replicas (5) is more than partitions (4)",
    "database-password-twice.yaml": "database.url has a password and database.passwordSecret",
    "postgres-ca-not-in-url.yaml": "add sslrootcert=/etc/eos-suite/postgres-ca/ca.crt",
    "kafka-ca-twice.yaml": "kafka.tls.ca sets ssl.ca.location",
    "wasm-module-not-mounted.yaml": "loads /opt/modules/card.wasm, which no volume mounts",
    "sampler-arg-without-ratio-sampler.yaml": "otel.samplerArg is only read by the ratio samplers",
    "image-digest-not-sha256.yaml": "'/sink/image/digest': '1.2.3' does not match pattern",
    "registry-format-without-url.yaml": "processor.inputFormat avro and processor.outputFormat json: a registry format needs schemaRegistry.url",
    "output-schema-registry-format-without-url.yaml": "processor.inputFormat json, processor.outputFormat json and processor.outputSchemas.flagged avro: a registry format needs schemaRegistry.url",
    "reconcile-strategy-unknown.yaml": "'/dedup/reconcileStrategies/partner': value must be one of 'lookup', 'replay', 'none'",
    "lookup-for-a-replay-target.yaml": "dedup.lookups has a look-up for target partner, which dedup.reconcileStrategies settles by replay",
    "relay-registry-format-without-url.yaml": "outboxRelay.valueFormat avro: a registry format needs schemaRegistry.url",
    "reader-schema-without-avro-input.yaml": "processor.inputReaderSchema (payments-value@2) needs processor.inputFormat avro, not protobuf",
    "relay-value-subjects-without-registry-format.yaml": "outboxRelay.valueSubjects (payments) needs a registry outboxRelay.valueFormat (avro, protobuf or json-schema), not json",
}

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")
# The binaries whose replicas keep their own Kafka positions: the instance id must be the pod name.
INSTANCE_BINARIES = ("eos-processor", "sink-writer")
# The order of the migration Job's steps, of the binaries that are enabled.
MIGRATION_ORDER = ("dedup-service", "sink-writer", "outbox-relay", "payments-api")

RULES_FILE = CHART / "files" / "prometheus" / "eos-suite.rules.yml"
DASHBOARD_FILES = sorted((CHART / "files" / "grafana").glob("*.json"))
# Every optional monitoring resource on, payments-api too (one more metrics Service).
MONITORING = ("serviceMonitor.enabled=true", "prometheusRule.enabled=true",
              "prometheusRule.labels.release=kube-prometheus-stack",
              "grafanaDashboards.enabled=true", "paymentsApi.enabled=true")
# The "<service> down" alert of each component with a metrics Service of its own.
DOWN_ALERTS = {"processor": "EosProcessorDown", "sink-writer": "EosSinkWriterDown",
               "dedup-service": "EosDedupServiceDown", "outbox-relay": "EosOutboxRelayDown"}


def helm_template(values_file=None, settings=()):
    command = [HELM, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION]
    if values_file is not None:
        command += ["--values", str(values_file)]
    for setting in settings:
        command += ["--set", setting]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def render(values_file=None, settings=()):
    result = helm_template(values_file, settings)
    if result.returncode != 0:
        raise AssertionError(
            f"helm template {values_file or '(defaults)'} {' '.join(settings)} failed:\n"
            f"{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def values_files():
    """(label, path) of every values set the chart must render: the defaults and ci/*.yaml."""
    return [("defaults", None)] + [
        (path.name, path) for path in sorted((CHART / "ci").glob("*.yaml"))
    ]


RENDERED = {}


def manifests(label, path):
    if label not in RENDERED:
        RENDERED[label] = render(path)
    return RENDERED[label]


def of_kind(docs, *kinds):
    return [doc for doc in docs if doc["kind"] in kinds]


def pod_spec(workload):
    return workload["spec"]["template"]["spec"]


def containers(workload, init=True):
    spec = pod_spec(workload)
    found = list(spec.get("containers", []))
    if init:
        found += spec.get("initContainers", [])
    return found


def env_of(container):
    return {entry["name"]: entry for entry in container.get("env", [])}


def binary_of(container):
    """The binary a container runs: the image name without registry, tag and digest."""
    return container["image"].rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]


def seconds(duration):
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, f"expected a duration in whole seconds, got {duration!r}"
    return int(match.group(1))


def workloads_running(docs, binary):
    """The Deployments/StatefulSets whose (first) container runs `binary`."""
    return [w for w in of_kind(docs, "Deployment", "StatefulSet")
            if binary_of(containers(w, init=False)[0]) == binary]


def relay_name(docs):
    """outbox-relay's OUTBOX_RELAY_NAME in a rendering (it must be a fixed value)."""
    (relay,) = workloads_running(docs, "outbox-relay")
    entry = env_of(containers(relay, init=False)[0])["OUTBOX_RELAY_NAME"]
    assert "valueFrom" not in entry, "OUTBOX_RELAY_NAME must be a fixed value"
    return entry["value"]


def render_values(values, settings=()):
    """Renders with `values` (a dict) as a values file: --set would make 0.1 or true strings."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        yaml.safe_dump(values, file)
        file.flush()
        return render(file.name, settings)


def template_output(values_file):
    """The raw `helm template` output of a values file (for byte-for-byte comparisons)."""
    result = helm_template(values_file)
    if result.returncode != 0:
        raise AssertionError(f"helm template {values_file} failed:\n{result.stderr}")
    return result.stdout


def file_source(workload, container, path):
    """(kind, name, key) of the Secret or ConfigMap key that `container` sees at `path`."""
    mounts = [m for m in container.get("volumeMounts", [])
              if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1, f"{container['name']}: {len(mounts)} mounts hold {path}"
    relative = path[len(mounts[0]["mountPath"].rstrip("/")) + 1:]
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mounts[0]["name"]]
    for kind, field, name_field in (("Secret", "secret", "secretName"),
                                    ("ConfigMap", "configMap", "name")):
        if field in volume:
            source = volume[field]
            items = source.get("items")
            if items is None:
                return kind, source[name_field], relative
            (item,) = [i for i in items if i["path"] == relative]
            return kind, source[name_field], item["key"]
    raise AssertionError(f"{path} is on volume {volume}, not a Secret or ConfigMap")


def secret_value(docs, reference):
    """The value a secretKeyRef points at, in a Secret the chart rendered."""
    (secret,) = [d for d in of_kind(docs, "Secret") if d["metadata"]["name"] == reference["name"]]
    if reference["key"] in secret.get("stringData", {}):
        return secret["stringData"][reference["key"]]
    return base64.b64decode(secret["data"][reference["key"]]).decode()


def kafka_properties(container):
    """EOS_KAFKA_PROPERTIES of a container as a dict."""
    value = env_of(container).get("EOS_KAFKA_PROPERTIES", {}).get("value", "")
    return dict(entry.split("=", 1) for entry in value.split(";") if entry)


def database_containers(docs):
    """(workload, container) of every container given a DATABASE_URL: services and migrate steps."""
    return [(workload, container)
            for workload in of_kind(docs, *WORKLOAD_KINDS)
            for container in containers(workload)
            if "DATABASE_URL" in env_of(container)]


def is_migration(workload):
    return workload["kind"] == "Job"


def pods_selected(selector, workload):
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(key) == value for key, value in selector.items())


def hook_weight(doc):
    return int(doc["metadata"].get("annotations", {}).get("helm.sh/hook-weight", "0"))


def hooks(doc):
    value = doc["metadata"].get("annotations", {}).get("helm.sh/hook", "")
    return {hook.strip() for hook in value.split(",") if hook.strip()}


class RenderedChart(unittest.TestCase):
    def each_rendering(self):
        for label, path in values_files():
            with self.subTest(values=label):
                yield label, manifests(label, path)

    def test_each_processor_and_sink_replica_gets_its_pod_name_as_instance_id(self):
        for label, docs in self.each_rendering():
            seen_binaries = set()
            all_ids = set()
            for workload in of_kind(docs, *WORKLOAD_KINDS):
                for container in containers(workload):
                    binary = binary_of(container)
                    if binary not in INSTANCE_BINARIES or container.get("args") == ["migrate"]:
                        continue
                    seen_binaries.add(binary)
                    name = workload["metadata"]["name"]
                    # Only a StatefulSet gives pods stable names (<name>-<ordinal>).
                    self.assertEqual(workload["kind"], "StatefulSet", f"{binary} in {name}")
                    self.assertEqual(workload["spec"].get("podManagementPolicy"), "Parallel")
                    instance = [e for e in container.get("env", []) if e["name"] == "EOS_INSTANCE_ID"]
                    self.assertEqual(len(instance), 1, f"{name}: exactly one EOS_INSTANCE_ID")
                    self.assertNotIn("value", instance[0], f"{name}: not a fixed value")
                    self.assertEqual(
                        instance[0]["valueFrom"],
                        {"fieldRef": {"fieldPath": "metadata.name"}},
                        f"{name}: EOS_INSTANCE_ID from the pod name",
                    )
                    replicas = workload["spec"]["replicas"]
                    ids = {f"{name}-{ordinal}" for ordinal in range(replicas)}
                    self.assertEqual(len(ids), replicas)
                    self.assertFalse(ids & all_ids, f"{name}: ids shared with another StatefulSet")
                    all_ids |= ids
            self.assertEqual(seen_binaries, set(INSTANCE_BINARIES), label)

    def test_processor_state_lives_on_its_own_volume_persistent_when_asked(self):
        def processor_and_state(docs):
            (workload,) = workloads_running(docs, "eos-processor")
            (container,) = containers(workload, init=False)
            state_dir = env_of(container)["EOS_STATE_DIR"]["value"]
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            self.assertIn(state_dir, mounts, "the state dir is a mounted volume")
            return workload, mounts[state_dir]

        for label, docs in self.each_rendering():
            with self.subTest(values=label):
                workload, volume = processor_and_state(docs)
                (source,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == volume]
                # Not the small /tmp emptyDir: the store grows with the dedup horizon.
                self.assertEqual(source["emptyDir"]["sizeLimit"], "2Gi")
                self.assertNotIn("volumeClaimTemplates", workload["spec"])
        docs = render(None, ("processor.state.persistent=true", "processor.state.size=50Gi",
                             "processor.state.storageClassName=fast"))
        workload, volume = processor_and_state(docs)
        self.assertNotIn(volume, [v["name"] for v in pod_spec(workload)["volumes"]])
        (claim,) = workload["spec"]["volumeClaimTemplates"]
        self.assertEqual(claim["metadata"]["name"], volume)
        self.assertEqual(claim["spec"]["resources"]["requests"]["storage"], "50Gi")
        self.assertEqual(claim["spec"]["storageClassName"], "fast")

    def test_grace_periods_outlast_the_shutdown_work(self):
        timeouts = {
            "eos-processor": "EOS_TRANSACTION_TIMEOUT",
            "sink-writer": "EOS_SINK_SHUTDOWN_TIMEOUT",
            "dedup-service": "DEDUP_SHUTDOWN_TIMEOUT",
            "outbox-relay": "OUTBOX_TRANSACTION_TIMEOUT",
        }
        seen = set()
        for _, docs in self.each_rendering():
            for workload in of_kind(docs, "Deployment", "StatefulSet"):
                for container in containers(workload):
                    variable = timeouts.get(binary_of(container))
                    if variable is None:
                        continue
                    timeout = seconds(env_of(container)[variable]["value"])
                    grace = pod_spec(workload)["terminationGracePeriodSeconds"]
                    self.assertGreater(grace, timeout, workload["metadata"]["name"])
                    seen.add(binary_of(container))
        self.assertEqual(seen, set(timeouts), "every binary with a shutdown timeout was checked")

    def test_every_service_container_has_liveness_and_readiness_probes(self):
        for _, docs in self.each_rendering():
            for workload in of_kind(docs, "Deployment", "StatefulSet"):
                for container in containers(workload):
                    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
                    for probe_name in ("livenessProbe", "readinessProbe"):
                        probe = container.get(probe_name)
                        self.assertIsNotNone(probe, f"{container['name']} {probe_name}")
                        if binary_of(container) == "dedup-service":
                            self.assertIn("grpc", probe, "dedup-service: native gRPC probes")
                            self.assertEqual(probe["grpc"]["port"], ports["grpc"])
                        else:
                            http = probe["httpGet"]
                            expected = "/healthz" if probe_name == "livenessProbe" else "/readyz"
                            self.assertEqual(http["path"], expected)
                            self.assertIn(http["port"], ports, "the probe's port is declared")

    def test_ops_and_grpc_addresses_listen_on_the_pod_network(self):
        address_variables = ("EOS_METRICS_ADDR", "DEDUP_METRICS_ADDR", "DEDUP_GRPC_ADDR",
                             "PROVIDER_SIM_ADDR", "OUTBOX_METRICS_ADDR", "PAYMENTS_API_ADDR",
                             "PAYMENTS_API_METRICS_ADDR")
        for _, docs in self.each_rendering():
            for workload in of_kind(docs, "Deployment", "StatefulSet"):
                for container in containers(workload):
                    env = env_of(container)
                    ports = {p["containerPort"] for p in container.get("ports", [])}
                    found = [v for v in address_variables if v in env]
                    self.assertTrue(found, f"{container['name']} sets its listen addresses")
                    for variable in found:
                        host, port = env[variable]["value"].rsplit(":", 1)
                        self.assertEqual(host, "0.0.0.0", f"{container['name']} {variable}")
                        self.assertIn(int(port), ports, f"{container['name']} {variable}")

    def test_pods_run_as_non_root_read_only_without_capabilities(self):
        for _, docs in self.each_rendering():
            for workload in of_kind(docs, *WORKLOAD_KINDS):
                spec = pod_spec(workload)
                pod_security = spec.get("securityContext", {})
                self.assertIs(spec.get("automountServiceAccountToken"), False)
                for container in containers(workload):
                    security = container.get("securityContext", {})
                    where = f"{workload['metadata']['name']}/{container['name']}"

                    def setting(key):
                        return security.get(key, pod_security.get(key))

                    self.assertIs(setting("runAsNonRoot"), True, where)
                    self.assertNotEqual(setting("runAsUser"), 0, where)
                    self.assertIs(security.get("readOnlyRootFilesystem"), True, where)
                    self.assertIs(security.get("allowPrivilegeEscalation"), False, where)
                    self.assertIn("ALL", security.get("capabilities", {}).get("drop", []), where)
                    self.assertFalse(security.get("capabilities", {}).get("add"), where)
                    self.assertEqual(setting("seccompProfile"), {"type": "RuntimeDefault"}, where)

    def test_migration_job_runs_before_everything_else(self):
        for _, docs in self.each_rendering():
            jobs = [d for d in of_kind(docs, "Job") if d["metadata"]["name"].endswith("-migrate")]
            self.assertEqual(len(jobs), 1)
            job = jobs[0]
            self.assertTrue({"pre-install", "pre-upgrade"} <= hooks(job), hooks(job))
            migration_secrets = {
                entry["valueFrom"]["secretKeyRef"]["name"]
                for container in containers(job)
                for entry in container.get("env", [])
                if "secretKeyRef" in entry.get("valueFrom", {})
            }
            self.assertEqual(len(migration_secrets), 1, "one owner-role Secret")
            for doc in docs:
                if doc is job or not hooks(doc):
                    continue
                what = f"{doc['kind']}/{doc['metadata']['name']}"
                if doc["kind"] == "Secret" and doc["metadata"]["name"] in migration_secrets:
                    # The Job's own input must exist before it: a lower weight still.
                    self.assertLess(hook_weight(doc), hook_weight(job), what)
                else:
                    self.assertGreater(hook_weight(doc), hook_weight(job), what)
            # The services are ordinary release resources: Helm creates them only after the
            # pre-install/pre-upgrade hooks succeeded.
            for workload in of_kind(docs, "Deployment", "StatefulSet"):
                self.assertFalse(hooks(workload), workload["metadata"]["name"])
            # Every service that uses the database has its schema step, one after the other (init
            # containers, then the last as the container), in a fixed order.
            spec = pod_spec(job)
            steps = spec.get("initContainers", []) + spec["containers"]
            self.assertEqual(len(spec["containers"]), 1)
            with_database = {
                binary_of(container)
                for workload in of_kind(docs, "Deployment", "StatefulSet")
                for container in containers(workload)
                if "DATABASE_URL" in env_of(container)
            }
            expected = [binary for binary in MIGRATION_ORDER if binary in with_database]
            self.assertEqual([binary_of(c) for c in steps], expected)
            for step in steps:
                self.assertEqual(step["args"], ["migrate"])
            self.assertEqual(spec["restartPolicy"], "Never")

    def test_services_use_the_runtime_role_and_skip_migrations(self):
        for _, docs in self.each_rendering():
            job = [d for d in of_kind(docs, "Job") if d["metadata"]["name"].endswith("-migrate")][0]
            owner_secret = env_of(containers(job)[0])["DATABASE_URL"]["valueFrom"]["secretKeyRef"]
            for workload in of_kind(docs, "Deployment", "StatefulSet"):
                for container in containers(workload):
                    env = env_of(container)
                    if "DATABASE_URL" not in env:
                        continue
                    self.assertEqual(env["EOS_SKIP_MIGRATIONS"]["value"], "true")
                    runtime = env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]
                    self.assertNotEqual(runtime["name"], owner_secret["name"])

    def test_statefulsets_have_their_headless_service(self):
        for _, docs in self.each_rendering():
            services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
            for workload in of_kind(docs, "StatefulSet"):
                service = services.get(workload["spec"]["serviceName"])
                self.assertIsNotNone(service, workload["metadata"]["name"])
                self.assertEqual(service["spec"].get("clusterIP"), "None")
                labels = workload["spec"]["template"]["metadata"]["labels"]
                for key, value in service["spec"]["selector"].items():
                    self.assertEqual(labels.get(key), value)

    def test_every_selector_matches_its_pods(self):
        for _, docs in self.each_rendering():
            pod_labels = [w["spec"]["template"]["metadata"]["labels"]
                          for w in of_kind(docs, "Deployment", "StatefulSet")]

            def matches(selector):
                return [labels for labels in pod_labels
                        if all(labels.get(k) == v for k, v in selector.items())]

            for workload in of_kind(docs, "Deployment", "StatefulSet"):
                selector = workload["spec"]["selector"]["matchLabels"]
                labels = workload["spec"]["template"]["metadata"]["labels"]
                self.assertTrue(all(labels.get(k) == v for k, v in selector.items()))
                self.assertEqual(len(matches(selector)), 1, "selectors do not overlap")
            for budget in of_kind(docs, "PodDisruptionBudget"):
                self.assertEqual(len(matches(budget["spec"]["selector"]["matchLabels"])), 1)
            for service in of_kind(docs, "Service"):
                self.assertEqual(len(matches(service["spec"]["selector"])), 1,
                                 service["metadata"]["name"])

    def test_outbox_relay_is_one_statefulset_pod_with_a_fixed_name(self):
        names = {}
        for label, docs in self.each_rendering():
            relays = workloads_running(docs, "outbox-relay")
            if not relays:
                continue
            (relay,) = relays
            # One pod that Kubernetes never runs twice at once: a StatefulSet of one.
            self.assertEqual(relay["kind"], "StatefulSet")
            self.assertEqual(relay["spec"]["replicas"], 1)
            container = containers(relay, init=False)[0]
            env = env_of(container)
            self.assertNotIn("EOS_INSTANCE_ID", env, "the relay's identity is its name only")
            # HTTP probes on its ops port, which listens on the pod network.
            ops_port = int(env["OUTBOX_METRICS_ADDR"]["value"].rsplit(":", 1)[1])
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            for probe_name, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                http = container[probe_name]["httpGet"]
                self.assertEqual(http["path"], path, label)
                self.assertEqual(ports[http["port"]], ops_port, label)
            name = relay_name(docs)
            self.assertTrue(name)
            self.assertEqual(env["EOS_GUARANTEE"]["value"], "exactly-once", label)
            names[label] = name
        self.assertIn("defaults", names, "the relay is on by default")
        # Derived from the release when not set: <namespace>-<full name> ...
        self.assertEqual(names["defaults"], f"default-{RELEASE}-eos-suite")
        # ... and the value itself when set.
        self.assertEqual(names["production-values.yaml"], "payments-prod")

    def test_outbox_relay_name_survives_upgrades_that_change_other_values(self):
        # The relay's name keys its position and its transactional.id: an upgrade that changes
        # the image, the replicas, the resources or the topics must not change it.
        for label, path in values_files():
            with self.subTest(values=label):
                before = relay_name(manifests(label, path))
                after = relay_name(render(path, (
                    "image.tag=9.9.9", "image.registry=registry.example.org",
                    "processor.replicas=7", "partitions=12",
                    "outboxRelay.resources.limits.memory=1Gi",
                    "outboxRelay.transactionTimeoutSeconds=20",
                    "outboxRelay.terminationGracePeriodSeconds=50",
                    "processor.inputTopic=payments-v2",
                )))
                self.assertEqual(before, after)
        # Two releases in one namespace get two names (two outboxes must not fence each other).
        other_release = subprocess.run(
            [HELM, "template", "other", str(CHART), "--kube-version", KUBE_VERSION],
            capture_output=True, text=True, check=True).stdout
        other_docs = [doc for doc in yaml.safe_load_all(other_release) if doc]
        self.assertNotEqual(relay_name(manifests("defaults", None)), relay_name(other_docs))

    def test_payments_api_publishes_to_the_processors_input_through_a_service(self):
        for label, docs in self.each_rendering():
            apis = workloads_running(docs, "payments-api")
            if not apis:
                continue
            (api,) = apis
            self.assertEqual(api["kind"], "Deployment")
            container = containers(api, init=False)[0]
            env = env_of(container)
            (processor,) = workloads_running(docs, "eos-processor")
            processor_input = env_of(containers(processor)[0])["EOS_INPUT_TOPIC"]["value"]
            self.assertEqual(env["PAYMENTS_API_TOPIC"]["value"], processor_input, label)
            (relay,) = workloads_running(docs, "outbox-relay")
            # ... which reads them in the format the relay writes them in.
            relay_format = env_of(containers(relay)[0]).get("OUTBOX_VALUE_FORMAT", {"value": "json"})
            self.assertEqual(relay_format["value"],
                             env_of(containers(processor)[0])["EOS_INPUT_FORMAT"]["value"], label)
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            services = [s for s in of_kind(docs, "Service")
                        if any(p.get("targetPort") == "http" for p in s["spec"]["ports"])
                        and s["spec"]["selector"].items()
                        <= api["spec"]["template"]["metadata"]["labels"].items()]
            self.assertEqual(len(services), 1, f"{label}: one HTTP Service of payments-api")
            self.assertIn("http", ports)

    def test_dedup_service_runs_several_replicas(self):
        for _, docs in self.each_rendering():
            dedup = [w for w in of_kind(docs, "Deployment")
                     if binary_of(containers(w)[0]) == "dedup-service"]
            self.assertEqual(len(dedup), 1)
            self.assertGreaterEqual(dedup[0]["spec"]["replicas"], 2)

    def test_sink_targets_file_is_mounted_and_parses(self):
        for _, docs in self.each_rendering():
            config_maps = {c["metadata"]["name"]: c for c in of_kind(docs, "ConfigMap")}
            for workload in of_kind(docs, "StatefulSet"):
                container = containers(workload)[0]
                path = env_of(container).get("EOS_SINK_CONFIG", {}).get("value")
                if path is None:
                    continue
                mount = [m for m in container["volumeMounts"]
                         if path.startswith(m["mountPath"] + "/")]
                self.assertEqual(len(mount), 1, path)
                volume = [v for v in pod_spec(workload)["volumes"]
                          if v["name"] == mount[0]["name"]][0]
                config_map = config_maps[volume["configMap"]["name"]]
                targets = tomllib.loads(config_map["data"][Path(path).name])["targets"]
                self.assertTrue(targets, "at least one target")

    def test_every_credential_file_a_target_or_look_up_names_comes_from_a_secret(self):
        # provider_auth_file / provider_ca_file of the sink's targets file and of dedup-service's
        # look-ups: on a Secret volume of the pod (sink.targetSecrets, dedup.lookupSecrets), or
        # the service would refuse to start.
        files = (("sink-writer", "EOS_SINK_CONFIG", "targets", "name"),
                 ("dedup-service", "DEDUP_LOOKUPS", "lookups", "target"))
        for label, docs in self.each_rendering():
            config_maps = {c["metadata"]["name"]: c for c in of_kind(docs, "ConfigMap")}
            for binary, variable, table, name_field in files:
                for workload in workloads_running(docs, binary):
                    container = containers(workload, init=False)[0]
                    path = env_of(container).get(variable, {}).get("value")
                    if path is None:
                        continue
                    _, name, key = file_source(workload, container, path)
                    entries = tomllib.loads(config_maps[name]["data"][key])[table]
                    self.assertTrue(entries, f"{label}: {variable} names at least one")
                    for entry in entries:
                        for field in ("provider_auth_file", "provider_ca_file"):
                            if field in entry:
                                kind, _, _ = file_source(workload, container, entry[field])
                                self.assertEqual(kind, "Secret",
                                                 f"{label}: {binary} {entry.get(name_field)}: {field}")


    def test_kafka_client_properties_reach_every_kafka_service(self):
        docs = manifests("kafka-tls-values.yaml", CHART / "ci" / "kafka-tls-values.yaml")
        for binary in ("eos-processor", "sink-writer", "outbox-relay"):
            (workload,) = workloads_running(docs, binary)
            container = containers(workload, init=False)[0]
            env = env_of(container)
            properties = env["EOS_KAFKA_PROPERTIES"]["value"].split(";")
            self.assertIn("security.protocol=SASL_SSL", properties, binary)
            self.assertIn("ssl.ca.location=/etc/eos-suite/kafka/ca.pem", properties, binary)
            path = env["EOS_KAFKA_PROPERTIES_FILE"]["value"]
            (mount,) = [m for m in container["volumeMounts"]
                        if path.startswith(m["mountPath"] + "/")]
            (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
            self.assertEqual(volume["secret"]["secretName"], "eos-suite-kafka-client", binary)

    def test_every_service_samples_traces_at_the_same_ratio_when_exporting(self):
        # A file, not --set: --set gives 0.1 as a string, which the schema refuses.
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values:
            values.write("telemetry:\n  otlpEndpoint: http://collector:4317\n"
                         "  samplingRatio: 0.1\npaymentsApi:\n  enabled: true\n")
            values.flush()
            docs = render(values.name)
        workloads = of_kind(docs, "Deployment", "StatefulSet")
        self.assertGreaterEqual(len(workloads), 5, "processor, sink, dedup, relay, payments-api")
        for workload in workloads:
            env = env_of(containers(workload, init=False)[0])
            with self.subTest(workload=workload["metadata"]["name"]):
                self.assertEqual(env["OTEL_TRACES_SAMPLER"]["value"], "parentbased_traceidratio")
                self.assertEqual(env["OTEL_TRACES_SAMPLER_ARG"]["value"], "0.1")
        for workload in of_kind(render(), "Deployment", "StatefulSet"):
            env = env_of(containers(workload, init=False)[0])
            self.assertNotIn("OTEL_TRACES_SAMPLER", env, "no endpoint: no tracing settings")

# Every component with its own keys, and the binary its pods run.
COMPONENTS = {"processor": "eos-processor", "sink": "sink-writer", "dedup": "dedup-service",
              "outboxRelay": "outbox-relay", "paymentsApi": "payments-api",
              "providerSim": "provider-sim"}
# The components whose replicas the chart spreads (the relay and provider-sim run one pod).
SPREAD_COMPONENTS = ("processor", "sink", "dedup", "paymentsApi")
ALL_ON = {"paymentsApi": {"enabled": True}, "providerSim": {"enabled": True}}
KAFKA_BINARIES = ("eos-processor", "sink-writer", "outbox-relay")
POSTGRES_CA = "/etc/eos-suite/postgres-ca/ca.crt"


def merged(*layers):
    """Values dicts merged key by key, later layers winning (as helm merges values files)."""
    result = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(result.get(key), dict):
                result[key] = merged(result[key], value)
            else:
                result[key] = value
    return result


def service_of(docs, binary):
    """The one Deployment/StatefulSet running `binary`, and its container."""
    (workload,) = workloads_running(docs, binary)
    return workload, containers(workload, init=False)[0]


def migration_job(docs):
    (job,) = [d for d in of_kind(docs, "Job") if d["metadata"]["name"].endswith("-migrate")]
    return job


class ProductionSettings(unittest.TestCase):
    """The settings a platform team needs: one test per setting, each checking the wiring."""

    def test_extra_env_volumes_and_mounts_reach_every_component_and_the_migration_job(self):
        values = dict(ALL_ON)
        for component in list(COMPONENTS) + ["migration"]:
            values[component] = merged(values.get(component, {}), {
                "extraEnv": [{"name": "EXTRA_MARK", "value": component},
                             {"name": "RUST_LOG", "value": f"debug,{component}"}],
                "extraVolumes": [{"name": f"extra-{component.lower()}",
                                  "secret": {"secretName": f"extra-{component.lower()}"}}],
                "extraVolumeMounts": [{"name": f"extra-{component.lower()}",
                                       "mountPath": f"/extra/{component}", "readOnly": True}],
            })
        docs = render_values(values)
        placed = {component: (service_of(docs, binary),) for component, binary in COMPONENTS.items()}
        job = migration_job(docs)
        placed["migration"] = tuple((job, step) for step in containers(job))
        self.assertEqual(len(placed["migration"]), 4, "one step per service with tables")
        for component, pairs in placed.items():
            for workload, container in pairs:
                where = f"{component}/{container['name']}"
                env = container["env"]
                self.assertEqual(env_of(container)["EXTRA_MARK"]["value"], component, where)
                # Last, so an extra variable overrides the chart's (Kubernetes takes the last).
                self.assertEqual([e["name"] for e in env[-2:]], ["EXTRA_MARK", "RUST_LOG"], where)
                self.assertEqual(file_source(workload, container, f"/extra/{component}/x"),
                                 ("Secret", f"extra-{component.lower()}", "x"), where)

    def test_kafka_ca_and_client_certificate_come_from_their_secrets_by_key(self):
        # Strimzi's Secrets as the operator makes them: the cluster CA under ca.crt, a
        # KafkaUser's certificate and key under user.crt and user.key.
        docs = render_values(merged(ALL_ON, {"kafka": {
            "clientProperties": {"security.protocol": "SSL"},
            "tls": {"ca": {"existingSecret": "my-cluster-cluster-ca-cert", "key": "ca.crt"},
                    "clientCert": {"existingSecret": "eos-suite-user",
                                   "certificateKey": "user.crt", "privateKeyKey": "user.key"}}}}))
        expected = {"ssl.ca.location": ("Secret", "my-cluster-cluster-ca-cert", "ca.crt"),
                    "ssl.certificate.location": ("Secret", "eos-suite-user", "user.crt"),
                    "ssl.key.location": ("Secret", "eos-suite-user", "user.key")}
        for binary in KAFKA_BINARIES:
            workload, container = service_of(docs, binary)
            properties = kafka_properties(container)
            self.assertEqual(properties["security.protocol"], "SSL", binary)
            for key, source in expected.items():
                self.assertEqual(file_source(workload, container, properties[key]), source,
                                 f"{binary} {key}")
        for binary in ("dedup-service", "payments-api", "provider-sim"):
            _, container = service_of(docs, binary)
            self.assertNotIn("EOS_KAFKA_PROPERTIES", env_of(container), binary)
            self.assertFalse([m for m in container["volumeMounts"] if "kafka" in m["name"]], binary)

    def test_database_password_and_ca_reach_every_service_and_the_migration_job(self):
        runtime_url = f"postgres://eos_app@db:5432/eos?sslmode=verify-full&sslrootcert={POSTGRES_CA}"
        owner_url = f"postgres://eos@db:5432/eos?sslmode=verify-full&sslrootcert={POSTGRES_CA}"
        docs = render_values(merged(ALL_ON, {
            "database": {"existingSecret": "", "url": runtime_url,
                         "passwordSecret": {"name": "eos-app", "key": "password"},
                         # An RDS-style CA bundle from a ConfigMap, under a key of its own.
                         "tls": {"ca": {"existingConfigMap": "rds-ca", "key": "bundle.pem"}}},
            "migration": {"existingSecret": "", "url": owner_url,
                          "passwordSecret": {"name": "eos-owner", "key": "pw"}}}))
        pairs = database_containers(docs)
        services = {binary_of(c) for w, c in pairs if not is_migration(w)}
        steps = {binary_of(c) for w, c in pairs if is_migration(w)}
        self.assertEqual(services, set(MIGRATION_ORDER), "every service with tables")
        self.assertEqual(steps, set(MIGRATION_ORDER), "every migrate step")
        for workload, container in pairs:
            where = f"{workload['kind']}/{container['name']}"
            env = env_of(container)
            url = secret_value(docs, env["DATABASE_URL"]["valueFrom"]["secretKeyRef"])
            self.assertEqual(url, owner_url if is_migration(workload) else runtime_url, where)
            password = ("Secret", "eos-owner", "pw") if is_migration(workload) \
                else ("Secret", "eos-app", "password")
            self.assertEqual(
                file_source(workload, container, env["DATABASE_PASSWORD_FILE"]["value"]),
                password, where)
            root_cert = re.search(r"sslrootcert=([^&]+)", url).group(1)
            self.assertEqual(file_source(workload, container, root_cert),
                             ("ConfigMap", "rds-ca", "bundle.pem"), where)
        # Without a password Secret the URL carries the password, as before.
        for workload, container in database_containers(manifests("defaults", None)):
            self.assertNotIn("DATABASE_PASSWORD_FILE", env_of(container), container["name"])

    def test_image_digests_win_over_tags_per_component(self):
        digest = "sha256:" + "ab" * 32
        docs = render_values(merged(ALL_ON, {
            "image": {"registry": "registry.example.com", "tag": "2.0.0"},
            "processor": {"image": {"tag": "2.1.0"}},
            "sink": {"image": {"tag": "2.1.0", "digest": digest}},
            "dedup": {"image": {"repository": "platform/dedup", "digest": digest}}}))
        expected = {
            "eos-processor": "registry.example.com/eos-suite/eos-processor:2.1.0",
            "sink-writer": f"registry.example.com/eos-suite/sink-writer@{digest}",
            "dedup": f"registry.example.com/platform/dedup@{digest}",
            "outbox-relay": "registry.example.com/eos-suite/outbox-relay:2.0.0",
            "payments-api": "registry.example.com/eos-suite/payments-api:2.0.0",
            "provider-sim": "registry.example.com/eos-suite/provider-sim:2.0.0",
        }
        images = {binary_of(c): c["image"] for w in of_kind(docs, "Deployment", "StatefulSet")
                  for c in containers(w)}
        self.assertEqual(images, expected)
        # The migration runs each service's own image, digest included.
        for step in containers(migration_job(docs)):
            self.assertEqual(step["image"], expected[binary_of(step)], step["name"])

    def test_partitions_bound_the_replicas_and_budgets_let_drains_evict_unready_pods(self):
        docs = render_values({"partitions": 6, "processor": {"replicas": 6},
                              "sink": {"replicas": 6}})
        workload, container = service_of(docs, "eos-processor")
        self.assertEqual(workload["spec"]["replicas"], 6)
        # The topics the processor creates get the same count.
        self.assertEqual(env_of(container)["EOS_PARTITIONS"]["value"], "6")
        for settings, says in (({"processor": {"replicas": 7}}, "processor.replicas (7)"),
                               ({"sink": {"replicas": 7}}, "sink.replicas (7)")):
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
                yaml.safe_dump(merged({"partitions": 6}, settings), file)
                file.flush()
                result = helm_template(file.name)
            self.assertNotEqual(result.returncode, 0, settings)
            self.assertIn(f"{says} is more than partitions (6)", result.stderr)
        # A not-ready replica (no partition, no Kafka) must not hold a drain up.
        for label, docs in RenderedChart.each_rendering(self):
            budgets = of_kind(docs, "PodDisruptionBudget")
            self.assertTrue(budgets, label)
            for budget in budgets:
                self.assertEqual(budget["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow",
                                 f"{label}: {budget['metadata']['name']}")
        docs = render(None, ("processor.podDisruptionBudget.unhealthyPodEvictionPolicy=IfHealthyBudget",))
        policies = {b["metadata"]["name"]: b["spec"]["unhealthyPodEvictionPolicy"]
                    for b in of_kind(docs, "PodDisruptionBudget")}
        self.assertEqual(policies.pop(f"{RELEASE}-eos-suite-processor"), "IfHealthyBudget")
        self.assertEqual(set(policies.values()), {"AlwaysAllow"})

    def test_replicas_spread_over_nodes_and_zones(self):
        def scheduling(docs, component):
            workload, _ = service_of(docs, COMPONENTS[component])
            spec = pod_spec(workload)
            return workload["spec"]["selector"]["matchLabels"], spec.get("affinity"), \
                spec.get("topologySpreadConstraints")

        docs = render_values(ALL_ON)
        for component in SPREAD_COMPONENTS:
            selector, affinity, spread = scheduling(docs, component)
            # Soft by default: prefer another node, and another zone when there is one.
            (term,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            self.assertEqual(term["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname")
            self.assertEqual(term["podAffinityTerm"]["labelSelector"]["matchLabels"], selector)
            (zone,) = spread
            self.assertEqual((zone["topologyKey"], zone["whenUnsatisfiable"], zone["maxSkew"]),
                             ("topology.kubernetes.io/zone", "ScheduleAnyway", 1), component)
            self.assertEqual(zone["labelSelector"]["matchLabels"], selector, component)
        for binary in ("outbox-relay", "provider-sim"):
            workload, _ = service_of(docs, binary)
            self.assertNotIn("affinity", pod_spec(workload), "one pod: nothing to spread")

        own_selector = {"matchLabels": {"team": "payments"}}
        docs = render_values(merged(ALL_ON, {
            "processor": {"podAntiAffinityPreset": "hard"},
            "sink": {"podAntiAffinityPreset": "", "topologySpreadConstraints": []},
            "dedup": {"topologySpreadConstraints": [
                {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname",
                 "whenUnsatisfiable": "DoNotSchedule", "labelSelector": own_selector}]}}))
        selector, affinity, _ = scheduling(docs, "processor")
        (term,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        self.assertEqual(term["labelSelector"]["matchLabels"], selector)
        _, affinity, spread = scheduling(docs, "sink")
        self.assertIsNone(affinity)
        self.assertIsNone(spread)
        _, _, spread = scheduling(docs, "dedup")
        self.assertEqual(spread[0]["labelSelector"], own_selector, "a selector given is kept")

        # The chart-wide affinity wins over the presets.
        node_affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "pool", "operator": "In", "values": ["payments"]}]}]}}}
        docs = render_values(merged(ALL_ON, {"affinity": node_affinity}))
        for component in SPREAD_COMPONENTS:
            _, affinity, _ = scheduling(docs, component)
            self.assertEqual(affinity, node_affinity, component)

    def test_probe_timings_per_component_and_a_startup_probe_for_the_stateful_services(self):
        docs = render_values(ALL_ON)
        for binary in ("eos-processor", "sink-writer"):
            _, container = service_of(docs, binary)
            startup, liveness = container["startupProbe"], container["livenessProbe"]
            # The liveness handler, with a longer budget: liveness waits for it.
            self.assertEqual(startup["httpGet"], liveness["httpGet"], binary)
            self.assertGreaterEqual(startup["failureThreshold"] * startup["periodSeconds"], 300)
        for binary in ("dedup-service", "outbox-relay", "payments-api", "provider-sim"):
            _, container = service_of(docs, binary)
            self.assertNotIn("startupProbe", container, binary)

        docs = render_values(merged(ALL_ON, {
            "processor": {"startupProbe": {"failureThreshold": 240}},
            "sink": {"startupProbe": {"enabled": False}},
            "dedup": {"livenessProbe": {"periodSeconds": 30, "timeoutSeconds": 5},
                      "readinessProbe": {"failureThreshold": 6, "successThreshold": 2}},
            "paymentsApi": {"readinessProbe": {"initialDelaySeconds": 3}}}))
        _, processor = service_of(docs, "eos-processor")
        self.assertEqual(processor["startupProbe"]["failureThreshold"], 240)
        self.assertEqual(processor["startupProbe"]["periodSeconds"], 5, "the other timings stay")
        self.assertNotIn("enabled", processor["startupProbe"])
        _, sink = service_of(docs, "sink-writer")
        self.assertNotIn("startupProbe", sink)
        _, dedup = service_of(docs, "dedup-service")
        self.assertEqual((dedup["livenessProbe"]["periodSeconds"],
                          dedup["livenessProbe"]["timeoutSeconds"]), (30, 5))
        self.assertIn("grpc", dedup["livenessProbe"], "the handler stays the chart's")
        self.assertEqual((dedup["readinessProbe"]["failureThreshold"],
                          dedup["readinessProbe"]["successThreshold"],
                          dedup["readinessProbe"]["grpc"]["service"]), (6, 2, "eos.dedup.v1.Dedup"))
        _, api = service_of(docs, "payments-api")
        self.assertEqual(api["readinessProbe"]["initialDelaySeconds"], 3)
        self.assertEqual(api["readinessProbe"]["httpGet"]["path"], "/readyz")

    def test_pods_that_read_chart_made_secrets_roll_when_one_changes(self):
        def checksums(values):
            docs = render_values(merged(ALL_ON, values))
            found = {}
            for workload in of_kind(docs, "Deployment", "StatefulSet"):
                annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
                found[binary_of(containers(workload)[0])] = annotations.get("checksum/secret")
            return docs, found

        chart_made = {"database": {"existingSecret": "", "url": "postgres://eos_app:one@db/eos"}}
        docs, found = checksums(chart_made)
        # What each pod reads: the runtime role's Secret, and the sink and dedup-service the tokens.
        secrets = {d["metadata"]["name"]: d for d in of_kind(docs, "Secret")}
        database = f"{RELEASE}-eos-suite-database/DATABASE_URL=postgres://eos_app:one@db/eos"
        tokens = secrets[f"{RELEASE}-eos-suite-dedup-tokens"]["data"]
        token_lines = [f"{RELEASE}-eos-suite-dedup-tokens/{key}={tokens[key]}"
                       for key in ("client-token", "operator-token")]

        def digest(lines):
            return hashlib.sha256("\n".join(lines).encode()).hexdigest()

        self.assertEqual(found, {
            "eos-processor": None, "provider-sim": None,
            "sink-writer": digest([database] + token_lines),
            "dedup-service": digest([database] + token_lines),
            "outbox-relay": digest([database]),
            "payments-api": digest([database]),
        })
        # A changed URL rolls every pod that reads it (the tokens are new in each offline render).
        _, changed = checksums({"database": {"existingSecret": "",
                                             "url": "postgres://eos_app:two@db/eos"}})
        for binary in ("sink-writer", "dedup-service", "outbox-relay", "payments-api"):
            self.assertNotEqual(changed[binary], found[binary], binary)
        # Secrets the chart does not make are not its to watch.
        _, found = checksums({"dedup": {"auth": {"existingSecret": "dedup-tokens"}}})
        self.assertEqual(set(found.values()), {None})

    def test_a_render_with_existing_secrets_makes_nothing_random(self):
        # GitOps (Argo CD renders with helm template: no lookup): with dedup.auth.existingSecret
        # two renders are the same, byte for byte, and no token is rendered at all.
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
            yaml.safe_dump(merged(ALL_ON, {"dedup": {"auth": {"existingSecret": "dedup-tokens"}}}),
                           file)
            file.flush()
            first, second = template_output(file.name), template_output(file.name)
            docs = render(file.name)
        self.assertEqual(first, second)
        for secret in of_kind(docs, "Secret"):
            self.assertFalse({"client-token", "operator-token"}
                             & set(secret.get("data", {}) | secret.get("stringData", {})),
                             secret["metadata"]["name"])
        token_secrets = {e["valueFrom"]["secretKeyRef"]["name"]
                         for w in of_kind(docs, "Deployment", "StatefulSet")
                         for c in containers(w) for e in c.get("env", [])
                         if e["name"] in ("EOS_DEDUP_TOKEN", "DEDUP_CLIENT_TOKEN",
                                          "DEDUP_OPERATOR_TOKEN")}
        self.assertEqual(token_secrets, {"dedup-tokens"})
        # Without it the offline render makes new tokens each time: why GitOps needs it.
        first, second = template_output(None), template_output(None)
        self.assertNotEqual(first, second)

    def test_network_policies_admit_only_callers_and_reach_only_dependencies(self):
        self.assertFalse(of_kind(manifests("defaults", None), "NetworkPolicy"), "off by default")
        monitoring = [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "monitoring"}}}]
        docs = render_values(merged(ALL_ON, {
            "telemetry": {"otlpEndpoint": "http://collector.observability:4317"},
            "networkPolicy": {"enabled": True, "metricsFrom": monitoring,
                              "postgres": {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
                                           "ports": [{"port": 5432, "protocol": "TCP"}]}}}))
        policies = of_kind(docs, "NetworkPolicy")
        workloads = of_kind(docs, *WORKLOAD_KINDS)

        def policy_of(workload):
            (policy,) = [p for p in policies
                         if pods_selected(p["spec"]["podSelector"]["matchLabels"], workload)]
            self.assertEqual(set(policy["spec"]["policyTypes"]), {"Ingress", "Egress"})
            return policy["spec"]

        def egress_ports(spec):
            return {port["port"] for rule in spec["egress"] for port in rule["ports"]}

        pods = {binary_of(containers(w)[0]) if w["kind"] != "Job" else "migration": w
                for w in workloads}
        self.assertEqual(len(policies), len(pods), "one policy per kind of pod")
        expected_egress = {
            "eos-processor": {53, 9092, 4317},
            "sink-writer": {53, 9092, 5432, 4317, 50051, 443, 8081},
            "dedup-service": {53, 5432, 4317, 443, 8081},
            "outbox-relay": {53, 9092, 5432, 4317},
            "payments-api": {53, 5432, 4317},
            "provider-sim": {53, 4317},
            "migration": {53, 5432},
        }
        for name, workload in pods.items():
            spec = policy_of(workload)
            self.assertEqual(egress_ports(spec), expected_egress[name], name)
            postgres = [r for r in spec["egress"] if r["ports"][0]["port"] == 5432]
            for rule in postgres:
                self.assertEqual(rule["to"], [{"ipBlock": {"cidr": "10.20.0.0/16"}}], name)
        # Ingress: the metrics port from monitoring only; the APIs from their callers.
        sink_pods = {"matchLabels": pods["sink-writer"]["spec"]["selector"]["matchLabels"]}
        dedup_pods = {"matchLabels": pods["dedup-service"]["spec"]["selector"]["matchLabels"]}
        for name in ("eos-processor", "sink-writer", "outbox-relay"):
            (rule,) = policy_of(pods[name])["ingress"]
            self.assertEqual(rule["from"], monitoring, name)
        ingress = {rule["ports"][0]["port"]: rule.get("from")
                   for rule in policy_of(pods["dedup-service"])["ingress"]}
        self.assertEqual(ingress, {9466: monitoring, 50051: [{"podSelector": sink_pods}]})
        ingress = [rule.get("from") for rule in policy_of(pods["provider-sim"])["ingress"]
                   if rule.get("from") != monitoring]
        self.assertEqual(ingress, [[{"podSelector": sink_pods}, {"podSelector": dedup_pods}]])
        self.assertEqual(policy_of(pods["migration"])["ingress"], [], "nothing calls the Job")
        # The sink reaches dedup-service's pods, nothing else of the release but provider-sim.
        (to_dedup,) = [r for r in policy_of(pods["sink-writer"])["egress"]
                       if r["ports"][0]["port"] == 50051]
        self.assertEqual(to_dedup["to"], [{"podSelector": dedup_pods}])

    def test_a_registry_input_gets_the_registry_its_credentials_file_and_egress(self):
        def processor(docs):
            (workload,) = workloads_running(docs, "eos-processor")
            (container,) = containers(workload, init=False)
            return workload, container

        _, container = processor(manifests("defaults", None))
        env = env_of(container)
        self.assertEqual(env["EOS_INPUT_FORMAT"]["value"], "json")
        self.assertNotIn("EOS_SCHEMA_REGISTRY_URL", env, "json needs no registry")
        docs = render_values({
            "processor": {"inputFormat": "avro"},
            "schemaRegistry": {"url": "https://registry.example.com", "authSecret": "registry"},
            "networkPolicy": {"enabled": True},
        })
        workload, container = processor(docs)
        env = env_of(container)
        self.assertEqual(env["EOS_INPUT_FORMAT"]["value"], "avro")
        self.assertEqual(env["EOS_SCHEMA_REGISTRY_URL"]["value"], "https://registry.example.com")
        auth_file = env["EOS_SCHEMA_REGISTRY_AUTH_FILE"]["value"]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        mount = mounts[auth_file.rsplit("/", 1)[0]]
        self.assertTrue(mount["readOnly"])
        (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
        self.assertEqual(volume["secret"]["secretName"], "registry")
        self.assertEqual(volume["secret"]["items"], [{"key": "auth", "path": "auth"}])
        (policy,) = [p for p in of_kind(docs, "NetworkPolicy")
                     if pods_selected(p["spec"]["podSelector"]["matchLabels"], workload)]
        ports = {port["port"] for rule in policy["spec"]["egress"] for port in rule["ports"]}
        self.assertIn(8081, ports, "the processor reaches the registry")
        # Outputs alone in a registry format need the registry as much.
        docs = render_values({
            "processor": {"outputFormat": "protobuf"},
            "schemaRegistry": {"url": "https://registry.example.com"},
        })
        _, container = processor(docs)
        env = env_of(container)
        self.assertEqual(env["EOS_OUTPUT_FORMAT"]["value"], "protobuf")
        self.assertEqual(env["EOS_SCHEMA_REGISTRY_URL"]["value"], "https://registry.example.com")
        # A reader's schema, for Avro input only.
        self.assertNotIn("EOS_INPUT_READER_SCHEMA", env, "only when given")
        docs = render_values({
            "processor": {"inputFormat": "avro", "inputReaderSchema": "payments-value@2"},
            "schemaRegistry": {"url": "https://registry.example.com"},
        })
        _, container = processor(docs)
        self.assertEqual(env_of(container)["EOS_INPUT_READER_SCHEMA"]["value"], "payments-value@2")
        bad = helm_template(None, ("processor.inputFormat=avro",
                                   "processor.inputReaderSchema=payments-value@v2",
                                   "schemaRegistry.url=https://registry.example.com"))
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("/processor/inputReaderSchema", bad.stderr)
        without = helm_template(None, ("processor.outputFormat=avro",))
        self.assertNotEqual(without.returncode, 0)
        self.assertIn("needs schemaRegistry.url", without.stderr)
        # A registry URL with credentials is refused by the schema.
        bad = helm_template(None, ("processor.inputFormat=avro",
                                   "schemaRegistry.url=https://u:p@registry.example.com"))
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("/schemaRegistry/url", bad.stderr)

    def test_a_sink_reading_a_registry_format_gets_the_registry_its_credentials_file_and_egress(self):
        def sink(docs):
            (workload,) = workloads_running(docs, "sink-writer")
            (container,) = containers(workload, init=False)
            return workload, container

        _, container = sink(manifests("defaults", None))
        env = env_of(container)
        self.assertEqual(env["EOS_INPUT_FORMAT"]["value"], "json")
        self.assertNotIn("EOS_SCHEMA_REGISTRY_URL", env, "json needs no registry")
        docs = render_values({
            "sink": {"inputFormat": "avro"},
            "schemaRegistry": {"url": "https://registry.example.com", "authSecret": "registry"},
            "networkPolicy": {"enabled": True},
        })
        workload, container = sink(docs)
        env = env_of(container)
        self.assertEqual(env["EOS_INPUT_FORMAT"]["value"], "avro")
        self.assertEqual(env["EOS_SCHEMA_REGISTRY_URL"]["value"], "https://registry.example.com")
        auth_file = env["EOS_SCHEMA_REGISTRY_AUTH_FILE"]["value"]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        mount = mounts[auth_file.rsplit("/", 1)[0]]
        self.assertTrue(mount["readOnly"])
        (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
        self.assertEqual(volume["secret"]["secretName"], "registry")
        (policy,) = [p for p in of_kind(docs, "NetworkPolicy")
                     if pods_selected(p["spec"]["podSelector"]["matchLabels"], workload)]
        ports = {port["port"] for rule in policy["spec"]["egress"] for port in rule["ports"]}
        self.assertIn(8081, ports, "the sink reaches the registry")
        without = helm_template(None, ("sink.inputFormat=protobuf",))
        self.assertNotEqual(without.returncode, 0)
        self.assertIn("sink.inputFormat protobuf: a registry format needs schemaRegistry.url",
                      without.stderr)

    def test_relay_value_format_and_subjects_get_the_registry_its_credentials_file_and_egress(self):
        def relay(docs):
            return service_of(docs, "outbox-relay")

        def parsed(value):
            """As the relay reads it: TOPIC=SUBJECT[@VERSION], comma-separated."""
            entries = {}
            for entry in value.split(","):
                topic, rest = entry.split("=", 1)
                subject, at, version = rest.rpartition("@")
                entries[topic] = ({"subject": subject, "version": int(version)} if at
                                  else {"subject": rest})
            return entries

        def registry_rules(docs, workload):
            (policy,) = [p for p in of_kind(docs, "NetworkPolicy")
                         if pods_selected(p["spec"]["podSelector"]["matchLabels"], workload)]
            return [rule for rule in policy["spec"]["egress"]
                    if rule["ports"] == registry["ports"]]

        # json (the default, or said): the rows as enqueued, no registry, no subjects.
        for docs in (manifests("defaults", None),
                     render_values({"outboxRelay": {"valueFormat": "json"},
                                    "schemaRegistry": {"url": "https://registry.example.com",
                                                       "authSecret": "registry"}})):
            workload, container = relay(docs)
            env = env_of(container)
            for variable in ("OUTBOX_VALUE_FORMAT", "OUTBOX_VALUE_SUBJECTS",
                             "EOS_SCHEMA_REGISTRY_URL", "EOS_SCHEMA_REGISTRY_AUTH_FILE"):
                self.assertNotIn(variable, env, "json needs no registry")
            self.assertNotIn("schema-registry-auth",
                             {v["name"] for v in pod_spec(workload)["volumes"]})

        registry = {"to": [{"ipBlock": {"cidr": "198.51.100.20/32"}}],
                    "ports": [{"port": 8443, "protocol": "TCP"}]}
        subjects = {"refunds": {"subject": "refunds-value"},
                    "payments": {"subject": "com.example.payments.Payment", "version": 3},
                    "audit.v2": {"subject": "com.example.Audit", "version": 12}}
        docs = render_values({
            "outboxRelay": {"valueFormat": "avro", "valueSubjects": subjects},
            "schemaRegistry": {"url": "https://registry.example.com", "authSecret": "registry"},
            "networkPolicy": {"enabled": True, "schemaRegistry": registry},
        })
        workload, container = relay(docs)
        env = env_of(container)
        names = [entry["name"] for entry in container["env"]]
        self.assertEqual(len(names), len(set(names)), "each variable once")
        self.assertEqual(env["OUTBOX_VALUE_FORMAT"]["value"], "avro")
        value = env["OUTBOX_VALUE_SUBJECTS"]["value"]
        self.assertEqual(value, "audit.v2=com.example.Audit@12,"
                                "payments=com.example.payments.Payment@3,refunds=refunds-value")
        self.assertEqual(parsed(value), subjects)
        self.assertEqual(env["EOS_SCHEMA_REGISTRY_URL"]["value"], "https://registry.example.com")
        # The credentials as a file from the Secret's key `auth`, mounted read-only.
        auth_file = env["EOS_SCHEMA_REGISTRY_AUTH_FILE"]["value"]
        self.assertEqual(file_source(workload, container, auth_file), ("Secret", "registry", "auth"))
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        self.assertTrue(mounts[auth_file.rsplit("/", 1)[0]]["readOnly"])
        # Egress to the registry: networkPolicy.schemaRegistry as it is, as for the processor.
        self.assertEqual(registry_rules(docs, workload), [registry])
        processor_workload, _ = service_of(docs, "eos-processor")
        self.assertEqual(registry_rules(docs, processor_workload), [], "the processor's input is json")
        # The other registry formats alike; no credentials file without authSecret.
        for value_format in ("protobuf", "json-schema"):
            docs = render_values({"outboxRelay": {"valueFormat": value_format},
                                  "schemaRegistry": {"url": "https://registry.example.com"},
                                  "networkPolicy": {"enabled": True, "schemaRegistry": registry}})
            workload, container = relay(docs)
            env = env_of(container)
            self.assertEqual(env["OUTBOX_VALUE_FORMAT"]["value"], value_format)
            self.assertNotIn("OUTBOX_VALUE_SUBJECTS", env, "no subjects: never an empty value")
            self.assertEqual(env["EOS_SCHEMA_REGISTRY_URL"]["value"], "https://registry.example.com")
            self.assertNotIn("EOS_SCHEMA_REGISTRY_AUTH_FILE", env)
            self.assertNotIn("schema-registry-auth",
                             {v["name"] for v in pod_spec(workload)["volumes"]})
            self.assertEqual(registry_rules(docs, workload), [registry], value_format)

        # Refused: a registry format without the registry, subjects for json values (both named
        # by test-values/ too), and entries the relay cannot parse.
        without = helm_template(None, ("outboxRelay.valueFormat=json-schema",))
        self.assertNotEqual(without.returncode, 0)
        self.assertIn("outboxRelay.valueFormat json-schema: a registry format needs "
                      "schemaRegistry.url", without.stderr)
        json_subjects = helm_template(None, ("outboxRelay.valueSubjects.refunds.subject=r",
                                             "outboxRelay.valueSubjects.orders.subject=o"))
        self.assertNotEqual(json_subjects.returncode, 0)
        self.assertIn("outboxRelay.valueSubjects (orders, refunds) needs a registry "
                      "outboxRelay.valueFormat", json_subjects.stderr)
        for relay_values, message in (
                ({"valueFormat": "xml"}, "'/outboxRelay/valueFormat': value must be one of"),
                ({"valueSubjects": {"orders": {"subject": "o", "version": 0}}},
                 "'/outboxRelay/valueSubjects/orders/version'"),
                ({"valueSubjects": {"orders": {"subject": "o", "version": "latest"}}},
                 "'/outboxRelay/valueSubjects/orders/version'"),
                ({"valueSubjects": {"orders": {"subject": "a,b"}}},
                 "'/outboxRelay/valueSubjects/orders/subject'"),
                ({"valueSubjects": {"orders": {"subject": "o@x"}}},
                 "'/outboxRelay/valueSubjects/orders/subject'"),
                ({"valueSubjects": {"orders": {"subject": ""}}},
                 "'/outboxRelay/valueSubjects/orders/subject'"),
                ({"valueSubjects": {"orders": {"version": 2}}}, "missing property 'subject'"),
                ({"valueSubjects": {"orders": {"subject": "o", "versoin": 2}}},
                 "additional properties 'versoin' not allowed"),
                ({"valueSubjects": {"or=ders": {"subject": "o"}}},
                 "additional properties 'or=ders' not allowed")):
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
                yaml.safe_dump({"outboxRelay": merged({"valueFormat": "avro"}, relay_values),
                                "schemaRegistry": {"url": "https://registry.example.com"}}, file)
                file.flush()
                result = helm_template(file.name)
            self.assertNotEqual(result.returncode, 0, relay_values)
            self.assertIn(message, result.stderr, relay_values)

    def test_sampler_and_log_level_reach_every_service(self):
        exporting = merged(ALL_ON, {"telemetry": {"otlpEndpoint": "http://collector:4317"}})
        cases = (
            ({"otel": {"sampler": "parentbased_always_on"}}, "parentbased_always_on", None),
            ({"otel": {"sampler": "traceidratio", "samplerArg": "0.25"}}, "traceidratio", "0.25"),
            # 0 traces nothing; it is not "unset".
            ({"otel": {"samplerArg": 0}, "telemetry": {"samplingRatio": 0.5}},
             "parentbased_traceidratio", "0"),
        )
        for values, sampler, argument in cases:
            docs = render_values(merged(exporting, values))
            for workload in of_kind(docs, "Deployment", "StatefulSet"):
                env = env_of(containers(workload)[0])
                where = f"{values}: {workload['metadata']['name']}"
                self.assertEqual(env["OTEL_TRACES_SAMPLER"]["value"], sampler, where)
                self.assertEqual(env.get("OTEL_TRACES_SAMPLER_ARG", {}).get("value"), argument,
                                 where)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
            yaml.safe_dump(merged(exporting, {"otel": {"samplerArg": 2}}), file)
            file.flush()
            result = helm_template(file.name)
        self.assertIn("otel.samplerArg (2) must be a ratio from 0 to 1", result.stderr)

        docs = render_values(merged(ALL_ON, {"logLevel": "warn",
                                             "sink": {"logLevel": "info,sink_writer=debug"}}))
        for workload in of_kind(docs, *WORKLOAD_KINDS):
            for container in containers(workload):
                expected = "info,sink_writer=debug" if (
                    workload["kind"] != "Job" and binary_of(container) == "sink-writer") else "warn"
                self.assertEqual(env_of(container)["RUST_LOG"]["value"], expected,
                                 container["name"])

    def test_processor_transform_and_webassembly_module(self):
        _, container = service_of(manifests("defaults", None), "eos-processor")
        env = env_of(container)
        self.assertEqual(env["EOS_TRANSFORM"]["value"], "ledger")
        self.assertFalse({"EOS_WASM_FUEL", "EOS_WASM_MAX_MEMORY"} & set(env), "only when set")

        # A small module from a ConfigMap's binaryData.
        docs = render_values({"processor": {
            "transform": "wasm:/etc/eos-suite/wasm/card.wasm",
            "wasm": {"configMap": "card-transform", "fuel": 5000000, "maxMemory": "64MiB"}}})
        workload, container = service_of(docs, "eos-processor")
        env = env_of(container)
        self.assertEqual(env["EOS_TRANSFORM"]["value"], "wasm:/etc/eos-suite/wasm/card.wasm")
        self.assertEqual(env["EOS_WASM_FUEL"]["value"], "5000000")
        self.assertEqual(env["EOS_WASM_MAX_MEMORY"]["value"], "64MiB")
        self.assertEqual(file_source(workload, container, "/etc/eos-suite/wasm/card.wasm"),
                         ("ConfigMap", "card-transform", "card.wasm"))

        # A larger one from any volume, through extraVolumes.
        docs = render_values({"processor": {
            "transform": "wasm:/opt/modules/card.wasm",
            "extraVolumes": [{"name": "modules", "persistentVolumeClaim": {"claimName": "modules"}}],
            "extraVolumeMounts": [{"name": "modules", "mountPath": "/opt/modules",
                                   "readOnly": True}]}})
        workload, container = service_of(docs, "eos-processor")
        self.assertEqual(env_of(container)["EOS_TRANSFORM"]["value"], "wasm:/opt/modules/card.wasm")
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/opt/modules"]
        (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
        self.assertEqual(volume["persistentVolumeClaim"]["claimName"], "modules")

        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
            yaml.safe_dump({"processor": {"wasm": {"configMap": "card-transform"}}}, file)
            file.flush()
            result = helm_template(file.name)
        self.assertIn("processor.wasm.configMap is set but processor.transform is", result.stderr)

    def test_dedup_reconcile_strategies_and_key_ttls_are_target_lists_sorted_by_target(self):
        def dedup_env(values):
            return env_of(service_of(render_values(values), "dedup-service")[1])

        def pairs(value):
            """As dedup-service reads it: comma-separated, each TARGET=VALUE at its first '='."""
            return [tuple(entry.split("=", 1)) for entry in value.split(",")]

        env = env_of(service_of(manifests("defaults", None), "dedup-service")[1])
        self.assertFalse({"DEDUP_RECONCILE_STRATEGIES", "DEDUP_KEY_TTLS"} & set(env),
                         "only when set: an empty value would not parse")
        env = dedup_env({"dedup": {"reconcileStrategies": {}, "keyTtls": {}}})
        self.assertFalse({"DEDUP_RECONCILE_STRATEGIES", "DEDUP_KEY_TTLS"} & set(env), "empty maps")

        values = {"dedup": {
            "reconcileStrategies": {"partner": "replay", "audit-hook": "none", "charge": "lookup"},
            "keyTtls": {"partner": "30d", "charge": "1h 30m"}}}
        env = dedup_env(values)
        self.assertEqual(env["DEDUP_RECONCILE_STRATEGIES"]["value"],
                         "audit-hook=none,charge=lookup,partner=replay")
        self.assertEqual(env["DEDUP_KEY_TTLS"]["value"], "charge=1h 30m,partner=30d")
        for variable, key in (("DEDUP_RECONCILE_STRATEGIES", "reconcileStrategies"),
                              ("DEDUP_KEY_TTLS", "keyTtls")):
            parsed = pairs(env[variable]["value"])
            self.assertEqual(dict(parsed), values["dedup"][key], variable)
            self.assertEqual([target for target, _ in parsed], sorted(values["dedup"][key]))
        # The same values in another order render the same (maps have no order in YAML).
        reordered = {"dedup": {key: dict(reversed(list(value.items())))
                               for key, value in values["dedup"].items()}}
        self.assertEqual(dedup_env(reordered), env)

        # What the list syntax cannot carry, or the service does not know, is refused.
        refused = (
            ({"reconcileStrategies": {"partner": "retry"}},
             "value must be one of 'lookup', 'replay', 'none'"),
            ({"reconcileStrategies": {"partner:eu": "replay"}},
             "additional properties 'partner:eu' not allowed"),
            ({"keyTtls": {"a,b": "1d"}}, "additional properties 'a,b' not allowed"),
            ({"keyTtls": {"partner": "30d,audit=1d"}}, "'/dedup/keyTtls/partner'"),
            ({"keyTtls": {"partner": 30}}, "'/dedup/keyTtls/partner': got number, want string"),
        )
        for dedup, message in refused:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
                yaml.safe_dump({"dedup": dedup}, file)
                file.flush()
                result = helm_template(file.name)
            self.assertNotEqual(result.returncode, 0, dedup)
            self.assertIn(message, result.stderr, dedup)

    def test_dedup_lookups_file_is_mounted_from_a_config_map_and_rolls_the_pods(self):
        def lookups_config_maps(docs):
            return [c for c in of_kind(docs, "ConfigMap")
                    if c["metadata"]["name"].endswith("-dedup-lookups")]

        docs = manifests("defaults", None)
        workload, container = service_of(docs, "dedup-service")
        self.assertNotIn("DEDUP_LOOKUPS", env_of(container), "only when set")
        self.assertFalse(lookups_config_maps(docs))
        self.assertNotIn("checksum/dedup-lookups",
                         workload["spec"]["template"]["metadata"].get("annotations", {}))

        text = '[[lookups]]\ntarget = "partner"\nurl = "https://partner.example.com/v1/{key}"\n'
        docs = render_values({"dedup": {"lookups": text}})
        workload, container = service_of(docs, "dedup-service")
        path = env_of(container)["DEDUP_LOOKUPS"]["value"]
        kind, name, key = file_source(workload, container, path)
        self.assertEqual((kind, name, key),
                         ("ConfigMap", f"{RELEASE}-eos-suite-dedup-lookups", "lookups.toml"))
        (config_map,) = lookups_config_maps(docs)
        self.assertEqual(config_map["data"][key], text, "the file as given")
        self.assertEqual(tomllib.loads(config_map["data"][key]), tomllib.loads(text))
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(annotations["checksum/dedup-lookups"],
                         hashlib.sha256(text.encode()).hexdigest())
        # A changed file rolls the pods, which read it at start-up only.
        changed = render_values({"dedup": {"lookups": text.replace("/v1/", "/v2/")}})
        self.assertNotEqual(
            service_of(changed, "dedup-service")[0]["spec"]["template"]["metadata"]
            ["annotations"]["checksum/dedup-lookups"], annotations["checksum/dedup-lookups"])
        # No dedup-service, no ConfigMap.
        docs = render_values({"dedup": {"enabled": False, "lookups": text}})
        self.assertFalse(lookups_config_maps(docs))

    def test_target_and_lookup_secrets_are_mounted_read_only_as_directories(self):
        defaults = manifests("defaults", None)
        for binary in ("sink-writer", "dedup-service"):
            workload, _ = service_of(defaults, binary)
            self.assertFalse([v["name"] for v in pod_spec(workload)["volumes"]
                              if v["name"].startswith(("target-secret-", "lookup-secret-"))],
                             f"{binary}: none by default")
        docs = render_values({
            "sink": {"targetSecrets": [{"name": "partner-api", "mountPath": "/run/secrets/partner"},
                                       {"name": "partner-ca", "mountPath": "/run/secrets/ca"}],
                     # Beside the generic extra volumes, not in their place.
                     "extraVolumes": [{"name": "extra", "emptyDir": {}}],
                     "extraVolumeMounts": [{"name": "extra", "mountPath": "/extra"}]},
            "dedup": {"lookupSecrets": [{"name": "lookup-api", "mountPath": "/run/secrets/lookup"}]},
        })
        expected = {
            "sink-writer": {"/run/secrets/partner/token": ("Secret", "partner-api", "token"),
                            "/run/secrets/ca/ca.pem": ("Secret", "partner-ca", "ca.pem")},
            "dedup-service": {"/run/secrets/lookup/token": ("Secret", "lookup-api", "token")},
        }
        for binary, files in expected.items():
            workload, container = service_of(docs, binary)
            for path, source in files.items():
                self.assertEqual(file_source(workload, container, path), source, binary)
                (mount,) = [m for m in container["volumeMounts"]
                            if path.startswith(m["mountPath"] + "/")]
                self.assertTrue(mount["readOnly"], f"{binary}: {path}")
            names = [v["name"] for v in pod_spec(workload)["volumes"]]
            self.assertEqual(len(names), len(set(names)), f"{binary}: volume names are unique")
        workload, container = service_of(docs, "sink-writer")
        self.assertIn("/extra", [m["mountPath"] for m in container["volumeMounts"]])
        # Each pod gets its own list only.
        _, processor = service_of(docs, "eos-processor")
        self.assertFalse([m for m in processor["volumeMounts"]
                          if m["mountPath"].startswith("/run/secrets")])
        _, dedup = service_of(docs, "dedup-service")
        self.assertNotIn("/run/secrets/partner", [m["mountPath"] for m in dedup["volumeMounts"]])

        for entry, message in (({"name": "partner-api"}, "missing property 'mountPath'"),
                               ({"name": "partner-api", "mountPath": "run/secrets"},
                                "'/sink/targetSecrets/0/mountPath'"),
                               ({"name": "Partner_API", "mountPath": "/run/secrets/p"},
                                "'/sink/targetSecrets/0/name'")):
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
                yaml.safe_dump({"sink": {"targetSecrets": [entry]}}, file)
                file.flush()
                result = helm_template(file.name)
            self.assertNotEqual(result.returncode, 0, entry)
            self.assertIn(message, result.stderr, entry)

    def test_processor_output_schemas_are_a_sorted_list_and_need_the_registry(self):
        def processor_env(docs):
            return env_of(service_of(docs, "eos-processor")[1])

        def parsed(value):
            """As the processor reads it: NAME=FORMAT[@SUBJECT], comma-separated."""
            entries = {}
            for entry in value.split(","):
                name, rest = entry.split("=", 1)
                format_, _, subject = rest.partition("@")
                entries[name] = {"format": format_, **({"subject": subject} if subject else {})}
            return entries

        self.assertNotIn("EOS_OUTPUT_SCHEMAS", processor_env(manifests("defaults", None)))
        schemas = {"flagged": {"format": "avro", "subject": "com.example.cards.Flagged"},
                   "audit": {"format": "json"},
                   "default": {"format": "json-schema", "subject": ""}}
        docs = render_values({"processor": {"outputSchemas": schemas},
                              "schemaRegistry": {"url": "https://registry.example.com"},
                              "networkPolicy": {"enabled": True}})
        env = processor_env(docs)
        value = env["EOS_OUTPUT_SCHEMAS"]["value"]
        self.assertEqual(value, "audit=json,default=json-schema,flagged=avro@com.example.cards.Flagged")
        self.assertEqual(parsed(value), {"flagged": schemas["flagged"], "audit": schemas["audit"],
                                         "default": {"format": "json-schema"}})
        self.assertEqual(env["EOS_SCHEMA_REGISTRY_URL"]["value"], "https://registry.example.com")
        workload, _ = service_of(docs, "eos-processor")
        (policy,) = [p for p in of_kind(docs, "NetworkPolicy")
                     if pods_selected(p["spec"]["podSelector"]["matchLabels"], workload)]
        ports = {port["port"] for rule in policy["spec"]["egress"] for port in rule["ports"]}
        self.assertIn(8081, ports, "an output in a registry format reaches the registry")

        # json outputs alone need no registry.
        env = processor_env(render_values({"processor": {"outputSchemas": {"audit": {"format": "json"}}}}))
        self.assertEqual(env["EOS_OUTPUT_SCHEMAS"]["value"], "audit=json")
        self.assertNotIn("EOS_SCHEMA_REGISTRY_URL", env)
        # One output in a registry format without the registry fails, naming it.
        without = helm_template(None, ("processor.outputSchemas.flagged.format=protobuf",))
        self.assertNotEqual(without.returncode, 0)
        self.assertIn("processor.outputSchemas.flagged protobuf: a registry format needs "
                      "schemaRegistry.url", without.stderr)
        for schema, message in (({"format": "xml"}, "'/processor/outputSchemas/flagged/format'"),
                                ({"subject": "x"}, "missing property 'format'"),
                                ({"format": "avro", "subject": "a,b"},
                                 "'/processor/outputSchemas/flagged/subject'")):
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
                yaml.safe_dump({"processor": {"outputSchemas": {"flagged": schema}},
                                "schemaRegistry": {"url": "https://registry.example.com"}}, file)
                file.flush()
                result = helm_template(file.name)
            self.assertNotEqual(result.returncode, 0, schema)
            self.assertIn(message, result.stderr, schema)


PRODUCTION_VALUES = CHART / "ci" / "production-values.yaml"
README = CHART / "README.md"


def kubernetes_validate():
    """kubernetes-validate: beside this Python (deploy/helm/check's venv) or on PATH."""
    beside = Path(sys.executable).parent / "kubernetes-validate"
    found = str(beside) if beside.exists() else shutil.which("kubernetes-validate")
    assert found, "kubernetes-validate not found: run this through deploy/helm/check"
    return found


class ProductionScenario(unittest.TestCase):
    """ci/production-values.yaml, the chart README's section Production values: SASL_SSL SCRAM Kafka with
    its CA from the operator's Secret, PostgreSQL verify-full with a private CA for every service
    and the migration Job, per-component digests, 6 partitions with 3 processor replicas,
    spreading, NetworkPolicies."""

    @classmethod
    def setUpClass(cls):
        cls.values = yaml.safe_load(PRODUCTION_VALUES.read_text())
        cls.output = template_output(PRODUCTION_VALUES)
        cls.docs = [doc for doc in yaml.safe_load_all(cls.output) if doc]

    def test_the_readme_shows_exactly_these_values(self):
        text = README.read_text()
        section = text.split("\n## Production values\n", 1)[1].split("\n## ", 1)[0]
        block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
        self.assertEqual(yaml.safe_load(block), self.values)

    def test_it_passes_kubernetes_validate_strict(self):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
            file.write(self.output)
            file.flush()
            result = subprocess.run(
                [kubernetes_validate(), "--strict", "--quiet", "-k", KUBE_VERSION, file.name],
                capture_output=True, text=True, check=False)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        # Only the Prometheus Operator's kind has no schema there (checked in Monitoring).
        unknown = [line for line in (result.stdout + result.stderr).splitlines()
                   if line.strip() and "kind ServiceMonitor" not in line]
        self.assertFalse(unknown, unknown)

    def test_kafka_is_sasl_ssl_scram_with_the_ca_from_the_operators_secret(self):
        for binary in KAFKA_BINARIES:
            workload, container = service_of(self.docs, binary)
            properties = kafka_properties(container)
            self.assertEqual(properties["security.protocol"], "SASL_SSL", binary)
            self.assertEqual(properties["sasl.mechanism"], "SCRAM-SHA-512", binary)
            self.assertEqual(file_source(workload, container, properties["ssl.ca.location"]),
                             ("Secret", "payments-kafka-cluster-ca-cert", "ca.crt"), binary)
            # The SCRAM password is in the properties Secret, never in the environment.
            self.assertNotIn("sasl.password", properties, binary)
            self.assertEqual(
                file_source(workload, container,
                            env_of(container)["EOS_KAFKA_PROPERTIES_FILE"]["value"]),
                ("Secret", "eos-suite-kafka-scram", "kafka.properties"), binary)

    def test_postgres_is_verify_full_against_the_private_ca_everywhere(self):
        pairs = database_containers(self.docs)
        self.assertEqual({binary_of(c) for w, c in pairs if is_migration(w)},
                         {binary_of(c) for w, c in pairs if not is_migration(w)})
        self.assertEqual(len(pairs), 8, "four services and their four migrate steps")
        for workload, container in pairs:
            where = f"{workload['kind']}/{container['name']}"
            env = env_of(container)
            url = secret_value(self.docs, env["DATABASE_URL"]["valueFrom"]["secretKeyRef"])
            self.assertIn("sslmode=verify-full", url, where)
            self.assertNotRegex(url, r"://[^@/]*:[^@/]*@", f"{where}: no password in the URL")
            root_cert = re.search(r"sslrootcert=([^&]+)", url).group(1)
            self.assertEqual(file_source(workload, container, root_cert),
                             ("Secret", "payments-db-ca", "ca.crt"), where)
            password = ("payments-db-owner" if is_migration(workload) else "payments-db-app",
                        "password")
            self.assertEqual(
                file_source(workload, container, env["DATABASE_PASSWORD_FILE"]["value"]),
                ("Secret",) + password, where)

    def test_every_image_is_pinned_by_its_own_digest(self):
        images = [c["image"] for w in of_kind(self.docs, *WORKLOAD_KINDS) for c in containers(w)]
        digests = {}
        for image in images:
            repository, _, digest = image.partition("@")
            self.assertRegex(digest, r"^sha256:[0-9a-f]{64}$", image)
            self.assertNotIn(":", repository.rsplit("/", 1)[-1], f"{image}: no tag beside it")
            digests.setdefault(repository, set()).add(digest)
        self.assertEqual(len(digests), 5, "five images")
        self.assertTrue(all(len(found) == 1 for found in digests.values()),
                        "a migrate step runs its service's digest")
        self.assertEqual(len({d for found in digests.values() for d in found}), 5)

    def test_three_processor_replicas_on_six_partitions_spread_over_nodes_and_zones(self):
        processor, container = service_of(self.docs, "eos-processor")
        self.assertEqual(processor["spec"]["replicas"], 3)
        self.assertEqual(env_of(container)["EOS_PARTITIONS"]["value"], "6")
        for binary in ("eos-processor", "sink-writer", "dedup-service", "payments-api"):
            workload, _ = service_of(self.docs, binary)
            spec = pod_spec(workload)
            self.assertIn("podAntiAffinity", spec["affinity"], binary)
            zones = [c for c in spec["topologySpreadConstraints"]
                     if c["topologyKey"] == "topology.kubernetes.io/zone"]
            self.assertEqual(len(zones), 1, binary)
        anti = pod_spec(processor)["affinity"]["podAntiAffinity"]
        self.assertIn("requiredDuringSchedulingIgnoredDuringExecution", anti, "hard: one per node")

    def test_a_network_policy_selects_every_pod(self):
        policies = of_kind(self.docs, "NetworkPolicy")
        for workload in of_kind(self.docs, *WORKLOAD_KINDS):
            selecting = [p for p in policies
                         if pods_selected(p["spec"]["podSelector"]["matchLabels"], workload)]
            self.assertEqual(len(selecting), 1, workload["metadata"]["name"])

    def test_a_second_render_is_the_same(self):
        # Nothing random: Argo CD's renders agree with each other and with the cluster.
        self.assertEqual(template_output(PRODUCTION_VALUES), self.output)


def alert_exprs():
    rules = yaml.safe_load(RULES_FILE.read_text())
    return {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}


def up_job_regexes(expr):
    return re.findall(r'up\{job=~"([^"]+)"\}', expr)


def dashboard_config_maps(docs, label=("grafana_dashboard", "1")):
    key, value = label
    return [c for c in of_kind(docs, "ConfigMap")
            if c["metadata"].get("labels", {}).get(key) == value]


class Monitoring(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.docs = render(None, MONITORING)

    def test_monitoring_resources_are_off_by_default(self):
        docs = manifests("defaults", None)
        self.assertFalse(of_kind(docs, "ServiceMonitor", "PrometheusRule"))
        self.assertFalse(dashboard_config_maps(docs))

    def test_prometheus_rule_is_the_rules_file_as_it_is(self):
        (rule,) = of_kind(self.docs, "PrometheusRule")
        self.assertEqual(rule["apiVersion"], "monitoring.coreos.com/v1")
        self.assertEqual(rule["spec"], yaml.safe_load(RULES_FILE.read_text()))
        self.assertEqual(rule["metadata"]["labels"]["release"], "kube-prometheus-stack")
        self.assertEqual(rule["metadata"]["labels"]["app.kubernetes.io/instance"], RELEASE)

    def test_up_rules_select_the_jobs_the_service_monitor_produces(self):
        # The Prometheus Operator names a ServiceMonitor target's job after its Service.
        (monitor,) = of_kind(self.docs, "ServiceMonitor")
        selector = monitor["spec"]["selector"]["matchLabels"].items()
        jobs = {service["metadata"]["labels"]["app.kubernetes.io/component"]: service["metadata"]["name"]
                for service in of_kind(self.docs, "Service")
                if selector <= service["metadata"]["labels"].items()}
        self.assertEqual(set(jobs), set(DOWN_ALERTS) | {"payments-api"})
        exprs = alert_exprs()
        (any_target,) = up_job_regexes(exprs["EosTargetDown"])
        for component, job in jobs.items():
            self.assertRegex(job, f"^(?:{any_target})$", f"EosTargetDown misses {component}")
        for component, alert in DOWN_ALERTS.items():
            (regex,) = up_job_regexes(exprs[alert])
            matched = {other for other, job in jobs.items() if re.fullmatch(regex, job)}
            self.assertEqual(matched, {component}, f"{alert} selects {regex!r}")

    def test_grafana_dashboards_are_config_maps_the_sidecar_loads(self):
        config_maps = dashboard_config_maps(self.docs)
        self.assertEqual(len(config_maps), len(DASHBOARD_FILES), "one ConfigMap per dashboard")
        self.assertTrue(DASHBOARD_FILES)
        uids = set()
        for config_map in config_maps:
            ((key, text),) = config_map["data"].items()
            # A ConfigMap holds at most 1 MiB.
            self.assertLess(len(text.encode()), 1024 * 1024, key)
            dashboard = json.loads(text)
            self.assertEqual(dashboard, json.loads((CHART / "files" / "grafana" / key).read_text()))
            self.assertTrue(dashboard["panels"], key)
            uids.add(dashboard["uid"])
            self.assertEqual(config_map["metadata"]["labels"]["app.kubernetes.io/instance"], RELEASE)
        self.assertEqual(len(uids), len(config_maps), "every dashboard has its own uid")

    def test_dashboard_labels_and_annotations_are_configurable(self):
        docs = render(None, ("grafanaDashboards.enabled=true",
                             "grafanaDashboards.labels.grafana_dashboard=null",
                             "grafanaDashboards.labels.dashboards=eos-suite",
                             "grafanaDashboards.annotations.grafana_folder=payments"))
        self.assertFalse(dashboard_config_maps(docs))
        config_maps = dashboard_config_maps(docs, ("dashboards", "eos-suite"))
        self.assertEqual(len(config_maps), len(DASHBOARD_FILES))
        for config_map in config_maps:
            self.assertEqual(config_map["metadata"]["annotations"], {"grafana_folder": "payments"})


class BadValues(unittest.TestCase):
    def test_bad_values_fail_the_render_saying_what_to_change(self):
        files = sorted((HERE / "test-values").glob("*.yaml"))
        self.assertEqual({f.name for f in files}, set(BAD_VALUES), "every bad file has its check")
        for path in files:
            with self.subTest(values=path.name):
                result = helm_template(path)
                self.assertNotEqual(result.returncode, 0, f"{path.name} must not render")
                self.assertIn(BAD_VALUES[path.name], result.stderr)


if __name__ == "__main__":
    sys.exit(unittest.main())
