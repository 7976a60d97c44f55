"""The metrics the services define, read from their Rust source (no PyYAML needed).

A metric is defined where a `counter!`, `gauge!`, `histogram!` or `describe_*!` call in
crates/*/src/**/*.rs names it, as a string literal or through a `const NAME: &str = "..."` of the
same crate, with one of the services' prefixes. Used by dashboard_metrics_test.py (every query
names a defined metric) and by docs/reference/generate (the guide's metrics reference), so both
read the code the same way.
"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted(REPO.glob("crates/*/src/**/*.rs"))
EXPORTER_SETUP = REPO / "crates/eos-runtime/src"

METRIC_PREFIXES = ("eos_", "outbox_relay_", "payments_api_")

# A metrics macro and the name it records or describes (a literal, or a constant's path).
METRIC_CALL = re.compile(
    r'\b(describe_)?(counter|gauge|histogram)!\(\s*("[^"]*"|[A-Za-z_][\w:]*)')
# A description: `describe_*!(NAME, ["unit",] "text")`, the text possibly continued with `\`.
DESCRIBE_CALL = re.compile(
    r'\bdescribe_(counter|gauge|histogram)!\(\s*("[^"]*"|[A-Za-z_][\w:]*)\s*,'
    r'(?:\s*[A-Za-z_][\w:]*\s*,)?\s*"((?:[^"\\]|\\.)*)"', re.S)
# A recording call: `counter!(NAME, "key" => value, ...)`; its arguments are read up to the
# parenthesis that closes it (`_arguments`), since label values hold calls of their own.
RECORD_CALL = re.compile(r'\b(counter|gauge|histogram)!\(\s*("[^"]*"|[A-Za-z_][\w:]*)')
LABEL_KEY = re.compile(r'"([a-z_]+)"\s*=>')


def rust_strings(text):
    """The string literals of a Rust source, comments and char literals skipped."""
    strings, i = [], 0
    while i < len(text):
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = len(text) if i < 0 else i
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = len(text) if end < 0 else end + 2
        elif raw := re.match(r'b?r(#*)"', text[i:i + 40]):
            closing = '"' + raw.group(1)
            end = text.find(closing, i + raw.end())
            strings.append(text[i + raw.end():end])
            i = end + len(closing)
        elif text[i] == '"':
            match = re.compile(r'"((?:[^"\\]|\\.)*)"', re.S).match(text, i)
            strings.append(match.group(1))
            i = match.end()
        elif char := re.compile(r"'(?:\\.|\\u\{[0-9a-fA-F]+\}|[^\\'])'").match(text, i):
            i = char.end()
        else:
            i += 1
    return strings


def rust_string_literals():
    return {literal for path in SOURCES for literal in rust_strings(path.read_text())}


def crate_of(path):
    return path.relative_to(REPO).parts[1]


def _constants(files):
    constants = {}
    for path in files:
        for name, value in re.findall(r'const\s+([A-Z0-9_]+)\s*:\s*&str\s*=\s*"([^"]+)"',
                                      path.read_text()):
            constants[name] = (value, str(path.relative_to(REPO)))
    return constants


def _resolve(argument, path, constants):
    """(metric name, file that names it) of a macro's first argument, or None."""
    if argument.startswith('"'):
        name, where = argument.strip('"'), str(path.relative_to(REPO))
    elif argument.split("::")[-1] in constants:
        name, where = constants[argument.split("::")[-1]]
    else:
        return None
    return (name, where) if name.startswith(METRIC_PREFIXES) else None


def _arguments(text, start):
    """The text from `start` to the parenthesis that closes the call open before it."""
    depth, i = 1, start
    while i < len(text) and depth:
        if text[i] == '"':
            match = re.compile(r'"((?:[^"\\]|\\.)*)"', re.S).match(text, i)
            i = match.end() if match else i + 1
            continue
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    return text[start:i - 1]


def _unescape(literal):
    """A Rust string literal's text: `\\` + newline skips the line break and the indentation."""
    literal = re.sub(r"\\\n\s*", "", literal)
    return literal.replace('\\"', '"').replace("\\\\", "\\")


def catalogue():
    """name -> {kind, crate, where, labels, description} for every metric the code defines."""
    metrics = {}
    for crate in sorted({crate_of(path) for path in SOURCES}):
        files = [p for p in SOURCES if crate_of(p) == crate]
        constants = _constants(files)
        for path in files:
            text = path.read_text()
            for _, kind, argument in METRIC_CALL.findall(text):
                resolved = _resolve(argument, path, constants)
                if resolved is None:
                    continue
                name, where = resolved
                entry = metrics.setdefault(name, {"kind": kind, "crate": crate, "where": where,
                                                  "labels": set(), "description": ""})
                if kind == "histogram":
                    entry["kind"] = kind
            for call in RECORD_CALL.finditer(text):
                resolved = _resolve(call.group(2), path, constants)
                if resolved is not None:
                    labels = LABEL_KEY.findall(_arguments(text, call.end()))
                    metrics[resolved[0]]["labels"] |= set(labels)
            for _, argument, description in DESCRIBE_CALL.findall(text):
                resolved = _resolve(argument, path, constants)
                if resolved is not None:
                    metrics[resolved[0]]["description"] = _unescape(description)
    return metrics


def histograms_have_buckets():
    """Whether eos-runtime's exporter is given buckets; without, a histogram is a summary."""
    return any("set_buckets" in p.read_text() for p in EXPORTER_SETUP.glob("*.rs"))


def defined_metrics():
    """name -> where it is defined; plus what each histogram is served as."""
    metrics = catalogue()
    defined = {name: entry["where"] for name, entry in metrics.items()}
    histograms = {name for name, entry in metrics.items() if entry["kind"] == "histogram"}
    buckets = histograms_have_buckets()
    for name in sorted(histograms):
        where = defined.get(name, "?")
        for suffix in ("_sum", "_count") + (("_bucket",) if buckets else ()):
            defined[name + suffix] = f"{where} (histogram {name})"
    return defined, histograms, buckets


def code_labels():
    """Label keys the services set: `"key" =>` inside the metrics macros."""
    keys = set()
    for path in SOURCES:
        for call in re.findall(r"(?:counter|gauge|histogram)!\((.*?)\)", path.read_text(), re.S):
            keys |= set(re.findall(r'"([a-z_]+)"\s*=>', call))
    return keys
