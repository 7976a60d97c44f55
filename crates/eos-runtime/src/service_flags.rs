//! Flag groups that mean the same in every service that has them, flattened into each service's
//! `Config` (`#[command(flatten)]`), so their names, environment variables and defaults cannot
//! drift apart. Flags whose default differs per service (the metrics port) stay in each `Config`.

use crate::telemetry::LogFormat;

/// The identity of an instance of a Kafka service that keeps its own positions (eos-processor,
/// sink-writer).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct InstanceFlags {
    /// Stable identity of this instance [default: the host name]. It is the static group
    /// membership id (group.instance.id), so a restarted instance takes its partitions back at
    /// once; eos-processor's transactional.id is <group-id>-<instance-id>, so a restarted
    /// instance with the same id fences its zombie. Keep it stable across restarts (e.g. the pod
    /// name) and unique per running instance.
    #[arg(long = "instance-id", env = "EOS_INSTANCE_ID")]
    pub instance_id: Option<String>,
}

impl InstanceFlags {
    /// The configured id, else the host name (a StatefulSet pod's name), else `localhost`.
    pub fn instance_id(&self) -> String {
        self.instance_id.clone().unwrap_or_else(|| {
            hostname::get()
                .ok()
                .and_then(|name| name.into_string().ok())
                .unwrap_or_else(|| "localhost".into())
        })
    }
}

/// How eos-processor and sink-writer log.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogFlags {
    /// Log format on stderr: text or json. RUST_LOG filters. Traces are exported over OTLP/gRPC
    /// when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    #[arg(long = "log-format", env = "EOS_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
}
