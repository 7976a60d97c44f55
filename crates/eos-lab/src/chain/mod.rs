//! The whole chain as child processes, for `eos-lab demo` and `eos-lab bench pipeline`: the
//! services ([`service`]), the run's own PostgreSQL database, and the sink's targets file.

pub(crate) mod service;

use anyhow::Context as _;

/// Creates `database` on the server of `server_url`; the URL of the new database.
pub(crate) async fn create_database(server_url: &str, database: &str) -> anyhow::Result<String> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(server_url)
        .await
        .context("connecting to PostgreSQL (is the stack up? deploy/local/stack up)")?;
    sqlx::query(&format!("CREATE DATABASE \"{database}\""))
        .execute(&mut conn)
        .await
        .with_context(|| format!("creating database {database}"))?;
    conn.close().await.ok();
    let mut url = reqwest::Url::parse(server_url).context("--database-url is not a URL")?;
    url.set_path(&format!("/{database}"));
    Ok(url.to_string())
}

pub(crate) async fn drop_database(server_url: &str, database: &str) -> anyhow::Result<()> {
    eos_testkit::scratch_database::drop_database(server_url, database)
        .await
        .with_context(|| format!("dropping database {database}"))
}

/// The sink's provider target: charges through dedup-service with the event as the operation.
pub(crate) struct ProviderTarget<'a> {
    pub(crate) name: &'a str,
    pub(crate) dedup_url: &'a str,
    pub(crate) provider_url: &'a str,
    /// The target's `concurrency` [default: sink-writer's].
    pub(crate) concurrency: Option<u64>,
}

/// The sink's targets: the default two tables and, given one, the provider charge.
pub(crate) fn sink_targets(written_by: &str, provider: Option<&ProviderTarget<'_>>) -> String {
    let mut targets = format!(
        r#"# Written by `{written_by}`.
[[targets]]
table = "event_sink"
kind = "append"
key = "event_id"
retention = "30d"
retention_column = "written_at"
[targets.columns]
event_id = "event_id"
entity_id = "entity_id"
value = "value"
payload = "payload"
fingerprint = "fingerprint"
source_topic = "kafka.topic"
source_partition = "kafka.partition"
source_offset = "kafka.offset"
written_at = "now"

[[targets]]
table = "entity_state"
kind = "versioned"
key = "entity_id"
[targets.columns]
entity_id = "entity_id"
version = "version"
payload = "payload"
event_id = "event_id"
updated_at = "now"
"#
    );
    if let Some(ProviderTarget {
        name,
        dedup_url,
        provider_url,
        concurrency,
    }) = provider
    {
        targets.push_str(&format!(
            r#"
[[targets]]
kind = "provider"
name = "{name}"
dedup_url = "{dedup_url}"
provider_url = "{provider_url}"
call_timeout = "1s"
lease_ttl = "10s"
"#
        ));
        if let Some(concurrency) = concurrency {
            targets.push_str(&format!("concurrency = {concurrency}\n"));
        }
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_targets_parse_as_the_sink_reads_them() -> anyhow::Result<()> {
        let tables = sink_writer::targets::parse(&sink_targets("test", None))?;
        assert_eq!((tables.tables.len(), tables.providers.len()), (2, 0));
        let provider = ProviderTarget {
            name: "pay",
            dedup_url: "http://127.0.0.1:1",
            provider_url: "http://127.0.0.1:2",
            concurrency: None,
        };
        let charged = sink_writer::targets::parse(&sink_targets("test", Some(&provider)))?;
        assert_eq!((charged.tables.len(), charged.providers.len()), (2, 1));
        assert_eq!(charged.providers[0].name, "pay");
        assert_eq!(
            charged.providers[0].concurrency,
            sink_writer::targets::DEFAULT_PROVIDER_CONCURRENCY
        );
        let wider = ProviderTarget {
            concurrency: Some(256),
            ..provider
        };
        let charged = sink_writer::targets::parse(&sink_targets("test", Some(&wider)))?;
        assert_eq!(charged.providers[0].concurrency, 256);
        Ok(())
    }
}
