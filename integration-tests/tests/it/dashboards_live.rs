//! The Grafana dashboards (deploy/helm/eos-suite/files/grafana/) against data: a real Prometheus
//! scrapes every service of an `eos-lab demo` run (found through `--prometheus-targets`), and
//! every panel's PromQL, run against it during the demo, returns data. Every metric a panel or
//! an alert names is one a service exported in that run; the test lists them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use integration_tests::prometheus_server::{
    PrometheusServer, Targets, dashboards_dir, rules_file, rules_with_for,
};
use integration_tests::{bootstrap_servers, workspace_binary};
use serde_json::Value;

/// Counters whose labels are known only when the error happens (a gRPC method and status code),
/// so they cannot start at 0: exported from the first such error on, and not in a healthy run.
/// `deploy/prometheus/dashboard_metrics_test.py` checks that the code defines them.
const ONLY_ON_ERROR: &[&str] = &["eos_dedup_rpc_errors_total"];

/// One panel query: (dashboard file, panel title, expression with Grafana's variables filled).
type PanelQuery = (String, String, String);

/// Grafana's built-in interval variables, as a dashboard's queries use them, and the dashboard's
/// own variables (a label filter: any value).
fn fill_variables(expr: &str, variables: &[String]) -> String {
    let mut filled = expr
        .replace("$__rate_interval", "30s")
        .replace("${__rate_interval}", "30s")
        .replace("$__interval", "5s")
        .replace("${__interval}", "5s")
        .replace("$__range", "5m")
        .replace("${__range}", "5m");
    for name in variables {
        for form in [
            format!("${{{name}:regex}}"),
            format!("${{{name}}}"),
            format!("${name}"),
        ] {
            filled = filled.replace(&form, ".*");
        }
    }
    filled
}

fn panels<'a>(panels: &'a Value, into: &mut Vec<&'a Value>) {
    for panel in panels.as_array().into_iter().flatten() {
        into.push(panel);
        // A collapsed row keeps its panels inside it.
        panels_of_row(panel, into);
    }
}

fn panels_of_row<'a>(panel: &'a Value, into: &mut Vec<&'a Value>) {
    if let Some(inner) = panel.get("panels") {
        panels(inner, into);
    }
}

fn panel_queries(dir: &Path) -> anyhow::Result<Vec<PanelQuery>> {
    let mut queries = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|ext| ext != "json") {
            continue;
        }
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dashboard: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
        let variables: Vec<String> = dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["type"] != "datasource")
            .filter_map(|v| v["name"].as_str().map(str::to_owned))
            .collect();
        let mut all = Vec::new();
        panels(&dashboard["panels"], &mut all);
        for panel in all {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    queries.push((
                        file.clone(),
                        panel["title"].as_str().unwrap_or_default().to_owned(),
                        fill_variables(expr, &variables),
                    ));
                }
            }
        }
    }
    Ok(queries)
}

/// The metric names an expression reads: identifiers followed by `{`, `[` or an operator, that
/// are not PromQL functions, keywords or label names.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const WORDS: &[&str] = &[
        "sum",
        "rate",
        "irate",
        "increase",
        "max",
        "min",
        "avg",
        "count",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "histogram_quantile",
        "absent",
        "deriv",
        "delta",
        "clamp_min",
        "clamp_max",
        "vector",
        "scalar",
        "time",
        "max_over_time",
        "min_over_time",
        "avg_over_time",
        "changes",
        "resets",
        "topk",
        "bottomk",
        "abs",
        "le",
        "offset",
        "bool",
        "label_replace",
        "sort_desc",
        "sort",
        "predict_linear",
        "timestamp",
        "last_over_time",
        "absent_over_time",
        "idelta",
        "count_over_time",
        "sum_over_time",
        "quantile_over_time",
        "round",
        "ceil",
        "floor",
    ];
    let mut names = BTreeSet::new();
    // Label matchers, ranges and strings are not metric names: drop `{...}` and `[...]` bodies
    // and quoted text.
    let mut cleaned = String::new();
    let (mut depth, mut quoted) = (0, false);
    for c in expr.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' | '[' if !quoted => depth += 1,
            '}' | ']' if !quoted => depth -= 1,
            _ if depth == 0 && !quoted => cleaned.push(c),
            _ => {}
        }
    }
    // `by (...)`/`on (...)` lists hold label names.
    let mut words = Vec::new();
    let mut word = String::new();
    for c in cleaned.chars().chain([' ']) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            if c == '(' || c == ')' {
                words.push(c.to_string());
            }
        }
    }
    let mut in_label_list = false;
    let mut previous = String::new();
    for word in &words {
        match word.as_str() {
            "(" => {
                in_label_list = matches!(
                    previous.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                );
            }
            ")" => in_label_list = false,
            w if !in_label_list
                && !WORDS.contains(&w)
                && w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && !w.chars().all(|c| c.is_ascii_digit()) =>
            {
                names.insert(w.to_owned());
            }
            _ => {}
        }
        previous.clone_from(word);
    }
    // Durations like `5m` start with a digit and are skipped above; units are not names.
    names
}

/// How long the demo may take, its audit included.
const DEMO_BOUND: Duration = Duration::from_secs(300);

/// The demo log's last 40 lines.
fn log_tail(log: &Path) -> String {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// What Prometheus scraped of the metrics `exprs` name, and of every target, over the run: each
/// series with its number of samples (for `up`, also how many scrapes succeeded), so that a
/// panel without data says whether its series was never exported, scraped once, or its target
/// was down.
fn scrape_history<'a>(
    prometheus: &PrometheusServer,
    exprs: impl IntoIterator<Item = &'a str>,
) -> String {
    let mut queries: Vec<String> = exprs
        .into_iter()
        .flat_map(metric_names)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|name| format!("count_over_time({name}[10m])"))
        .collect();
    queries.extend(["count_over_time(up[10m])", "sum_over_time(up[10m])"].map(str::to_owned));
    let mut lines = vec!["what was scraped over the last 10 minutes:".to_owned()];
    for query in queries {
        match prometheus.query(&query) {
            Ok(series) if series.is_empty() => lines.push(format!("  {query}: no series")),
            Ok(series) => lines.extend(
                series
                    .iter()
                    .map(|one| format!("  {query} {}: {}", one["metric"], one["value"][1])),
            ),
            Err(error) => lines.push(format!("  {query}: {error:#}")),
        }
    }
    lines.join("\n")
}

#[test]
fn every_dashboard_panel_returns_data_during_a_demo_and_names_exported_metrics()
-> anyhow::Result<()> {
    let queries = panel_queries(&dashboards_dir())?;
    assert!(queries.len() >= 20, "{} panel queries", queries.len());
    let dir = std::env::temp_dir().join(integration_tests::unique_name("dashboards"));
    std::fs::create_dir_all(&dir)?;
    let targets = dir.join("targets.json");
    // An empty target list until the demo writes its own: Prometheus starts watching at once.
    std::fs::write(&targets, "[]")?;
    let prometheus = PrometheusServer::start(
        &[("eos-suite", Targets::File(&targets))],
        &rules_with_for("2s")?,
    )?;

    let _postgres = integration_tests::postgres_in_use()?;
    // The demo's log, for a failure to be explained.
    std::fs::create_dir_all(integration_tests::service_process::log_dir())?;
    let demo_log = integration_tests::service_process::log_dir().join(format!(
        "{}.log",
        integration_tests::unique_name("dashboards-demo")
    ));
    let started = SystemTime::now();
    let mut demo = Command::new(workspace_binary("eos-lab")?)
        .args([
            "--bootstrap-servers",
            &bootstrap_servers(),
            "demo",
            // 30 s of payments: every process, SIGKILLed or not, lives through several scrapes
            // (a 10 s run left the relay's processes one scrape each, and their series none).
            "--events",
            "9000",
            "--rate",
            "300",
            "--relay-kills",
            "1",
            "--processor-kills",
            "1",
            "--sink-kills",
            "1",
            "--runs-dir",
            &dir.display().to_string(),
            "--prometheus-targets",
            &targets.display().to_string(),
            "--drop-database",
            "--json",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&demo_log)?)
        .spawn()?;

    // Each panel is judged over the whole run, as Grafana shows a panel over a time range: a
    // series a process exported for a few scrapes before its SIGKILL counts, wherever the run
    // was when it was scraped.
    let deadline = Instant::now() + DEMO_BOUND;
    let demo_status = loop {
        if let Some(status) = demo.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = demo.kill();
            let _ = demo.wait();
            panic!(
                "the demo did not end within {DEMO_BOUND:?}\n{}",
                log_tail(&demo_log)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        demo_status.success(),
        "the demo failed: {demo_status} ({})\n{}",
        demo_log.display(),
        log_tail(&demo_log)
    );
    // The processes' last scrapes are in once the demo has stopped them; one more scrape
    // interval for Prometheus to have written them.
    std::thread::sleep(Duration::from_secs(2));
    let run = (started, SystemTime::now());
    let names_seen: BTreeSet<String> = prometheus.metric_names()?.into_iter().collect();
    let mut empty: Vec<(&PanelQuery, String)> = Vec::new();
    for query in &queries {
        match prometheus.query_range(&query.2, run, Duration::from_millis(500)) {
            Ok(series) if !series.is_empty() => {}
            Ok(_) => empty.push((query, String::new())),
            Err(error) => empty.push((query, format!("{error:#}"))),
        }
    }
    assert!(
        empty.is_empty(),
        "panels without data over the run:\n{}\n{}",
        empty
            .iter()
            .map(|((file, title, expr), error)| format!("{file} {title:?}: {expr} {error}"))
            .collect::<Vec<_>>()
            .join("\n"),
        scrape_history(
            &prometheus,
            empty.iter().map(|((_, _, expr), _)| expr.as_str())
        )
    );

    // Every metric a panel or an alert names was exported in this run.
    let rules = std::fs::read_to_string(rules_file())?;
    let rule_exprs: Vec<String> = rules
        .split("expr:")
        .skip(1)
        .map(|rest| {
            rest.lines()
                .take_while(|line| !line.trim_start().starts_with("for:"))
                .take_while(|line| !line.trim_start().starts_with("labels:"))
                .collect::<Vec<_>>()
                .join(" ")
                .replace('|', " ")
        })
        .collect();
    let mut named: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, title, expr) in &queries {
        for name in metric_names(expr) {
            named
                .entry(name)
                .or_default()
                .insert(format!("{file} {title:?}"));
        }
    }
    for expr in &rule_exprs {
        for name in metric_names(expr) {
            named.entry(name).or_default().insert("rules".to_owned());
        }
    }
    eprintln!("metrics the dashboards and alerts name ({}):", named.len());
    for (name, users) in &named {
        eprintln!(
            "  {name}: {}",
            users.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    let unknown: Vec<&String> = named
        .keys()
        .filter(|name| !names_seen.contains(name.as_str()))
        .filter(|name| !ONLY_ON_ERROR.contains(&name.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "named but exported by no service in the run: {unknown:?}"
    );
    Ok(())
}

#[test]
fn metric_names_are_told_from_functions_labels_and_durations() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le, job) (rate(eos_sink_batch_duration_seconds_bucket{job=~"sink.*"}[$__rate_interval]))) > on (job) max(up) and absent(eos_x_total offset 5m)"#,
    );
    assert_eq!(
        names,
        [
            "eos_sink_batch_duration_seconds_bucket",
            "eos_x_total",
            "up"
        ]
        .map(str::to_owned)
        .into()
    );
}
