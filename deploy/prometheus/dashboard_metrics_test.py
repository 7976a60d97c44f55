#!/usr/bin/env python3
"""Every alert expression and every Grafana panel queries only what the services export.

Reads the metric names the services define from their code — the string literals starting
`eos_`, `outbox_relay_` or `payments_api_` in crates/*/src/**/*.rs that a `counter!`, `gauge!`,
`histogram!` or `describe_*!` call names, directly or through a constant — and the names a
histogram is served under, then extracts every metric name from the PromQL of each alert in
deploy/helm/eos-suite/files/prometheus/eos-suite.rules.yml and of each panel and template
variable in deploy/helm/eos-suite/files/grafana/*.json. It fails when a query names a metric no
service defines, a label no service sets, or an exact label value (`outcome="rolled_back"`) that
appears nowhere in the code; when an alert lacks its severity or annotations; or when a panel
does not take its data source from the `${datasource}` variable. It prints the list it checked.

A histogram is served as the exporter renders it: eos-runtime's ops endpoint installs
metrics-exporter-prometheus without buckets, so each histogram is a summary (`<name>` with a
`quantile` label, `<name>_sum`, `<name>_count`) and `<name>_bucket` exists only once buckets are
configured there (`set_buckets`).

With `--write-promql FILE` it also writes every dashboard query, Grafana's variables replaced by
sample values, as a recording rule to FILE, for `promtool check rules` to parse (the check
script does).

Run alone:  python3 deploy/prometheus/dashboard_metrics_test.py   (needs PyYAML; run by
deploy/prometheus/check).
"""

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import yaml

# What the services define is read by metrics_in_code.py beside this file, shared with the
# guide's metrics reference (docs/reference/generate).
sys.dont_write_bytecode = True  # no __pycache__ left in the tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
from metrics_in_code import REPO, code_labels, defined_metrics, rust_string_literals  # noqa: E402

RULES = REPO / "deploy/helm/eos-suite/files/prometheus/eos-suite.rules.yml"
DASHBOARDS = REPO / "deploy/helm/eos-suite/files/grafana"
# Prometheus's own series of every target.
PROMETHEUS_METRICS = {"up"}
# Labels the scrape adds (the Prometheus Operator adds namespace, pod, service, ...) and the
# exporter's own on summaries and histograms.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}
EXPORTER_LABELS = {"quantile", "le"}
SEVERITIES = {"critical", "warning", "info"}
ANNOTATIONS = {"summary", "description", "runbook"}

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan", "Inf", "NaN", "atan2"}
STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\''
MATCHERS = re.compile(r"\{((?:[^{}\"']|" + STRING + r")*)\}")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(" + STRING + ")")
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
NUMBER = re.compile(r"(?<![A-Za-z0-9_:.])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?")
IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\$?[A-Za-z_][A-Za-z0-9_]*")
LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)


def unquote(literal):
    return literal[1:-1].encode().decode("unicode_escape")


def parse_promql(expr):
    """(metric names, label names, (label, operator, value) matchers) of one expression."""
    expr = GRAFANA_VARIABLE.sub("VAR", expr)
    matchers = [MATCHER.findall(body) for body in MATCHERS.findall(expr)]
    labels = {name for found in matchers for name, _, _ in found}
    triples = [(name, op, unquote(value)) for found in matchers for name, op, value in found]
    rest = MATCHERS.sub(" ", expr)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)
    rest = re.sub(STRING, " ", rest)
    for _, names in GROUPING.findall(rest):
        labels |= {name.strip() for name in names.split(",") if name.strip()}
    rest = GROUPING.sub(" ", rest)
    rest = NUMBER.sub(" ", rest)
    metrics = set()
    for match in IDENTIFIER.finditer(rest):
        word = match.group()
        if word in KEYWORDS or word == "VAR" or rest[match.end():].lstrip().startswith("("):
            continue
        metrics.add(word)
    return metrics, labels, triples


def self_test():
    """The extractor on known expressions: a check that cannot find anything proves nothing."""
    metrics, labels, triples = parse_promql(
        'sum by (namespace, job) (rate(eos_x_total{outcome="aborted", job=~"$job"}[10m])) '
        '/ on (job) group_left sum(rate(eos_y_total[5m] offset 1h)) > 0.05 or vector(1e3) '
        'and absent(up{job=~".*processor(-metrics)?"} == 1)')
    assert metrics == {"eos_x_total", "eos_y_total", "up"}, metrics
    assert labels == {"namespace", "job", "outcome"}, labels
    assert ("outcome", "=", "aborted") in triples, triples
    assert parse_promql("histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m])))")[0] == {"a_bucket"}
    assert parse_promql("max(eos_z{quantile=\"0.99\"}) * 2")[0] == {"eos_z"}


def alert_queries(problems):
    queries = []
    groups = yaml.safe_load(RULES.read_text())["groups"]
    for group in groups:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            where = f"{RULES.name}: {name}"
            queries.append((where, rule["expr"]))
            if "alert" not in rule:
                continue
            severity = rule.get("labels", {}).get("severity")
            if severity not in SEVERITIES:
                problems.append(f"{where}: severity {severity!r} is not one of {sorted(SEVERITIES)}")
            missing = ANNOTATIONS - set(rule.get("annotations", {}))
            if missing:
                problems.append(f"{where}: annotations missing: {sorted(missing)}")
    return queries


def dashboard_queries(problems):
    queries = []
    dashboards = sorted(DASHBOARDS.glob("*.json"))
    if not dashboards:
        problems.append(f"no dashboards in {DASHBOARDS}")
    for path in dashboards:
        dashboard = json.loads(path.read_text())
        variables = {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}
        source = variables.get("datasource", {})
        if source.get("type") != "datasource" or source.get("query") != "prometheus":
            problems.append(f"{path.name}: no `datasource` variable of type prometheus")
        for variable in variables.values():
            if variable.get("type") != "query":
                continue
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            found = LABEL_VALUES.match(query)
            expr = found.group(1) if found else query
            queries.append((f"{path.name}: variable {variable['name']}", expr))
        panels = list(dashboard.get("panels", []))
        while panels:
            panel = panels.pop(0)
            panels.extend(panel.get("panels", []))
            targets = panel.get("targets", [])
            if panel.get("type") in ("row", "text"):
                continue
            if not targets:
                problems.append(f"{path.name}: panel {panel.get('title')!r} has no query")
            for target in [panel] + targets:
                uid = target.get("datasource", {}).get("uid")
                if uid != "${datasource}":
                    problems.append(f"{path.name}: panel {panel.get('title')!r} uses data source {uid!r}, not ${{datasource}}")
            for target in targets:
                expr = target.get("expr", "")
                if not expr.strip():
                    problems.append(f"{path.name}: panel {panel.get('title')!r} has an empty query")
                queries.append((f"{path.name}: {panel.get('title')}", expr))
    return queries


# Sample values of Grafana's variables, so that a query parses as PromQL.
SAMPLE_VARIABLES = {"$__rate_interval": "2m", "$__range": "1h", "$namespace": ".*", "$job": ".*"}


def write_promql(queries, path):
    """Every dashboard query as a recording rule, for `promtool check rules`."""
    rules = []
    for index, (where, expr) in enumerate(queries):
        if where.startswith(RULES.name):
            continue
        for variable, value in SAMPLE_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard_query_{index}", "expr": expr,
                      "labels": {"panel": where}})
    Path(path).write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]},
                                         sort_keys=False, width=1000))


def main():
    self_test()
    problems = []
    defined, histograms, buckets = defined_metrics()
    allowed = dict(defined, **{name: "Prometheus" for name in PROMETHEUS_METRICS})
    labels_allowed = code_labels() | TARGET_LABELS | EXPORTER_LABELS
    literals = rust_string_literals()
    queries = alert_queries(problems) + dashboard_queries(problems)

    used = defaultdict(set)
    for where, expr in queries:
        metrics, labels, matchers = parse_promql(expr)
        if not metrics:
            problems.append(f"{where}: no metric found in {expr!r}")
        for metric in metrics:
            used[metric].add(where.split(":")[0])
            if metric not in allowed:
                problems.append(f"{where}: {metric} is not a metric any service defines")
        for label in labels - labels_allowed:
            problems.append(f"{where}: label {label!r} is set by no service nor the scrape")
        for label, op, value in matchers:
            if label in TARGET_LABELS or "VAR" in value or label == "quantile":
                continue
            alternatives = value.split("|") if op in ("=~", "!~") else [value]
            for alternative in alternatives:
                if re.fullmatch(r"[A-Za-z0-9_]+", alternative) and alternative not in literals:
                    problems.append(f"{where}: {label}={alternative!r} appears nowhere in the code")

    print(f"histograms served as {'histograms with buckets' if buckets else 'summaries (quantile, _sum, _count)'}: "
          + ", ".join(sorted(histograms)))
    print(f"{len(used)} metric names in {len(queries)} queries (alert rules and dashboards), checked against "
          f"{len(allowed)} names defined in crates/*/src:")
    for metric in sorted(used):
        status = "ok     " if metric in allowed else "MISSING"
        print(f"  {status} {metric:52} {allowed.get(metric, '-'):52} used by {', '.join(sorted(used[metric]))}")
    unused = sorted(name for name in defined if name not in used and not name.endswith(("_sum", "_count", "_bucket")))
    if unused:
        print("defined, on no dashboard and in no rule (not a failure): " + ", ".join(unused))
    if problems:
        print(f"\n{len(problems)} problem(s):")
        for problem in problems:
            print(f"  FAIL {problem}")
        return 1
    if "--write-promql" in sys.argv:
        write_promql(queries, sys.argv[sys.argv.index("--write-promql") + 1])
    print("dashboard_metrics_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
