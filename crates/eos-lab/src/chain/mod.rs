//! The whole chain as child processes, for `eos-lab demo` and `eos-lab bench pipeline`: the
//! services ([`service`]) and the run's own PostgreSQL database; the sink's targets file is
//! eos-testkit's, which the tests write too.

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

pub(crate) use eos_testkit::sink_targets::{ProviderTarget, sink_targets};

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
            as_http: false,
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
        let http = ProviderTarget {
            as_http: true,
            ..provider
        };
        let http = sink_writer::targets::parse(&sink_targets("test", Some(&http)))?;
        let sink_writer::targets::ProviderCall::Http(call) = &http.providers[0].call else {
            anyhow::bail!("an http target: {:?}", http.providers[0].call);
        };
        assert_eq!(call.url, "http://127.0.0.1:2/charges");
        assert_eq!(
            call.body.clone(),
            sink_writer::targets::HttpBody::Fields(vec![
                ("amount".to_owned(), serde_json::json!("/value")),
                ("entity_id".to_owned(), serde_json::json!("entity_id")),
                ("event_id".to_owned(), serde_json::json!("event_id")),
            ])
        );
        Ok(())
    }
}
