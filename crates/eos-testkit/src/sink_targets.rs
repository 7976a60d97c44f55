//! The sink-writer targets file the lab's pipeline and the integration tests run the sink with:
//! the two default tables and, given one, the provider charge through dedup-service. One writer,
//! so the tests run the sink as `eos-lab demo` does (eos-lab's `chain` checks that sink-writer
//! parses it).

/// The sink's provider target: charges through dedup-service with the event as the operation.
#[derive(Debug, Clone)]
pub struct ProviderTarget<'a> {
    pub name: &'a str,
    pub dedup_url: &'a str,
    pub provider_url: &'a str,
    /// The target's `concurrency` [default: sink-writer's].
    pub concurrency: Option<u64>,
    /// The same charge written as a `kind = "http"` target, its request spelled out (`POST
    /// {provider_url}/charges`, the body's amount, event id and entity id, the key header by
    /// default): the bytes sent are the same, so a benchmark compares the two kinds.
    pub as_http: bool,
}

/// The sink's targets: the default two tables and, given one, the provider charge.
pub fn sink_targets(written_by: &str, provider: Option<&ProviderTarget<'_>>) -> String {
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
        as_http,
    }) = provider
    {
        let call = if *as_http {
            format!(
                "kind = \"http\"\nurl = \"{provider_url}/charges\"\n\
                 body = {{ amount = \"/value\", event_id = \"event_id\", entity_id = \"entity_id\" }}\n"
            )
        } else {
            format!("kind = \"provider\"\nprovider_url = \"{provider_url}\"\n")
        };
        targets.push_str(&format!(
            r#"
[[targets]]
name = "{name}"
dedup_url = "{dedup_url}"
call_timeout = "1s"
lease_ttl = "10s"
{call}"#
        ));
        if let Some(concurrency) = concurrency {
            targets.push_str(&format!("concurrency = {concurrency}\n"));
        }
    }
    targets
}
