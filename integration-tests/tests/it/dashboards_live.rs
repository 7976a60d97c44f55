//! The Grafana dashboards (deploy/helm/eos-suite/files/grafana/) against data: a real Prometheus
//! scrapes every service of an `eos-lab demo` run (found through `--prometheus-targets`), and
//! every panel's PromQL, run against it during the demo, returns data. Every metric a panel or
//! an alert names is one a service exported in that run; the test lists them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    let mut demo = Command::new(workspace_binary("eos-lab")?)
        .args([
            "--bootstrap-servers",
            &bootstrap_servers(),
            "demo",
            "--events",
            "3000",
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

    // Each query is retried until it returns data or the demo ends: a counter appears with the
    // first event it counts, a rate needs two scrapes of it.
    let mut pending: BTreeMap<usize, &PanelQuery> = queries.iter().enumerate().collect();
    let mut last_errors: BTreeMap<usize, String> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut names_seen = BTreeSet::new();
    while !pending.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(2));
        names_seen.extend(prometheus.metric_names()?);
        pending.retain(|index, (_, _, expr)| match prometheus.query(expr) {
            Ok(result) => result.is_empty(),
            Err(error) => {
                last_errors.insert(*index, error.to_string());
                true
            }
        });
        if demo.try_wait()?.is_some() {
            // One last look after the end: the final scrapes are in.
            break;
        }
    }
    let demo_status = match demo.try_wait()? {
        Some(status) => status,
        None => demo.wait()?,
    };
    names_seen.extend(prometheus.metric_names()?);
    let _ = std::fs::remove_dir_all(&dir);
    if !demo_status.success() {
        let log = std::fs::read_to_string(&demo_log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!(
            "the demo failed: {demo_status} ({})\n{}",
            demo_log.display(),
            tail.join("\n")
        );
    }
    let empty: Vec<String> = pending
        .iter()
        .map(|(index, (file, title, expr))| {
            format!(
                "{file} {title:?}: {expr} {}",
                last_errors.get(index).cloned().unwrap_or_default()
            )
        })
        .collect();
    assert!(
        empty.is_empty(),
        "panels without data:\n{}",
        empty.join("\n")
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
