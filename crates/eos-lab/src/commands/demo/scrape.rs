//! Every service's Prometheus text, read from its /metrics, and the sums the report takes of it.

use std::net::SocketAddr;

/// Every service's Prometheus text at the end of the run (`None`: not scraped).
#[derive(Debug)]
pub(super) struct Scraped {
    pub(super) processor: Option<String>,
    pub(super) sink: Option<String>,
    pub(super) dedup: Option<String>,
    pub(super) provider: Option<String>,
}

pub(super) async fn scrape(addr: SocketAddr) -> Option<String> {
    let response = reqwest::get(format!("http://{addr}/metrics")).await.ok()?;
    response.error_for_status().ok()?.text().await.ok()
}

/// The sum of every sample of `name` whose labels include each of `labels` (`key="value"`).
pub(super) fn metric_sum(text: &str, name: &str, labels: &[&str]) -> i64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, label_text) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let wanted = metric == name && labels.iter().all(|l| label_text.contains(l));
            wanted.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum::<f64>() as i64
}
