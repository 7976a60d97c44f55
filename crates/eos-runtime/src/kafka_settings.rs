//! The Kafka connection settings every service and eosctl share: the bootstrap servers and the
//! extra librdkafka properties (TLS, SASL, timeouts) that pass through to every Kafka client a
//! process creates — its consumers, its transactional or idempotent producers and its admin
//! clients all start from [`KafkaSettings::client_config`].
//!
//! Extra properties come from three places, applied in this order so a later one overrides an
//! earlier one for the same key:
//!
//! 1. `--kafka-properties-file PATH` / `EOS_KAFKA_PROPERTIES_FILE`: Java-properties style, one
//!    `key=value` per line, `#` or `!` starts a comment line. The place for secrets such as
//!    `sasl.password` (mount it from a secret store).
//! 2. `--kafka-properties LIST` / `EOS_KAFKA_PROPERTIES`: `key=value` entries separated by `;` or
//!    newlines.
//! 3. `-X/--kafka-property KEY=VALUE`, repeatable.
//!
//! Properties exactly-once depends on are set by the services themselves and refused here (with
//! the source that named them), so a passthrough cannot turn off idempotence, `read_committed`
//! or manual offset commits. Values are never logged or shown in errors: only keys are (see
//! [`KafkaSettings::property_keys`]), and the `Debug` form redacts secret-looking values.
//!
//! A program that starts Kafka services (eos-lab's demo and bench) hands them its own settings
//! through [`KafkaSettings::write_for_children`]: a properties file only its user can read, named
//! in each child's environment — never on a command line, which every user of the machine sees.

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use rdkafka::ClientConfig;

/// Properties no Kafka client of eos-suite takes from the passthrough: each process sets them
/// itself (or has its own flag for them) because exactly-once, completeness or the fencing
/// depends on them. Aliases librdkafka accepts for the same setting are listed too.
pub const EXACTLY_ONCE_PROPERTIES: &[&str] = &[
    // --bootstrap-servers has its own flag.
    "bootstrap.servers",
    "metadata.broker.list",
    // Producers: idempotent, acks from all in-sync replicas, transactional where the service is.
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "transactional.id",
    // Consumers: read_committed, positions stored only by the service, static membership, a new
    // group starts at the beginning of the log.
    "isolation.level",
    "enable.auto.commit",
    "auto.commit.enable",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "group.id",
    "group.instance.id",
    "group.protocol",
    "partition.assignment.strategy",
    "enable.partition.eof",
    // Topics are created explicitly, with the partition counts the services check.
    "allow.auto.create.topics",
];

/// The environment variable of the properties list (`--kafka-properties`).
pub const PROPERTIES_LIST_ENV: &str = "EOS_KAFKA_PROPERTIES";
/// The environment variable of the properties file (`--kafka-properties-file`).
pub const PROPERTIES_FILE_ENV: &str = "EOS_KAFKA_PROPERTIES_FILE";

/// Where the separators of the `EOS_KAFKA_PROPERTIES` list are.
const LIST_SEPARATORS: [char; 2] = [';', '\n'];

/// Why the Kafka settings cannot be built. No variant carries a property value.
#[derive(Debug, thiserror::Error)]
pub enum KafkaSettingsError {
    /// `origin` says where the entry is (`EOS_KAFKA_PROPERTIES entry 2`, `--kafka-property 1`,
    /// `file:line`); no part of the entry is kept, since a missing `=` can glue a secret to its
    /// key (`sasl.passwordSECRET`).
    #[error("{origin} is not KEY=VALUE (the entry is not shown: it may hold a secret)")]
    NotKeyValue { origin: String },
    #[error(
        "{origin}: {key} cannot be overridden: this program sets it itself (exactly-once depends \
         on it, or one of its own flags sets it)"
    )]
    Refused { origin: String, key: String },
    /// A value (or key) with a line break: no librdkafka property has one, and it could not be
    /// handed on in a properties file.
    #[error("{origin}: the value of {key} spans lines")]
    MultiLine { origin: String, key: String },
    #[error("cannot read --kafka-properties-file {path}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The Kafka flags of every service and eosctl, flattened into their command lines.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KafkaFlags {
    /// Kafka bootstrap servers, comma-separated host:port.
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap_servers: String,

    /// Extra librdkafka property KEY=VALUE for every Kafka client (security.protocol, ssl.*,
    /// sasl.*, timeouts); repeatable; overrides --kafka-properties and --kafka-properties-file.
    /// Properties exactly-once depends on (bootstrap.servers, enable.idempotence, acks,
    /// isolation.level, enable.auto.commit, group.id, transactional.id, ...) are refused.
    #[arg(short = 'X', long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_properties: Vec<String>,

    /// Extra librdkafka properties as one list: KEY=VALUE entries separated by ';' or newlines.
    #[arg(
        long = "kafka-properties",
        env = "EOS_KAFKA_PROPERTIES",
        hide_env_values = true,
        value_name = "LIST"
    )]
    pub kafka_properties_list: Option<String>,

    /// File of extra librdkafka properties, one KEY=VALUE per line ('#' or '!' starts a comment
    /// line): the place for secrets such as sasl.password. Values are never logged.
    #[arg(
        long = "kafka-properties-file",
        env = "EOS_KAFKA_PROPERTIES_FILE",
        value_name = "PATH"
    )]
    pub kafka_properties_file: Option<PathBuf>,
}

impl KafkaFlags {
    /// The settings these flags give, reading the properties file. `refused` are the properties
    /// the calling service sets itself beyond [`EXACTLY_ONCE_PROPERTIES`].
    pub fn settings(&self, refused: &[&str]) -> Result<KafkaSettings, KafkaSettingsError> {
        let mut entries = Vec::new();
        if let Some(path) = &self.kafka_properties_file {
            let text =
                std::fs::read_to_string(path).map_err(|source| KafkaSettingsError::ReadFile {
                    path: path.clone(),
                    source,
                })?;
            entries.extend(parse_properties_file(path, &text)?);
        }
        if let Some(list) = &self.kafka_properties_list {
            // Entries are counted from 1, blank ones included, so the number finds the entry.
            for (index, entry) in list.split(LIST_SEPARATORS).enumerate() {
                if entry.trim().is_empty() {
                    continue;
                }
                let origin = format!("{PROPERTIES_LIST_ENV} entry {}", index + 1);
                entries.push(parse_entry(&origin, entry)?);
            }
        }
        for (index, entry) in self.kafka_properties.iter().enumerate() {
            entries.push(parse_entry(
                &format!("--kafka-property {}", index + 1),
                entry,
            )?);
        }
        KafkaSettings::from_entries(self.bootstrap_servers.clone(), entries, refused)
    }
}

/// One `key=value` with where it came from, for error messages.
struct Entry {
    origin: String,
    key: String,
    value: String,
}

fn parse_entry(origin: &str, entry: &str) -> Result<Entry, KafkaSettingsError> {
    let not_key_value = || KafkaSettingsError::NotKeyValue {
        origin: origin.to_owned(),
    };
    let (key, value) = entry.split_once('=').ok_or_else(not_key_value)?;
    let key = key.trim();
    if key.is_empty() {
        return Err(not_key_value());
    }
    Ok(Entry {
        origin: origin.to_owned(),
        key: key.to_owned(),
        value: value.trim().to_owned(),
    })
}

/// Java-properties style lines: `key=value`; blank lines and lines starting with `#` or `!` are
/// skipped. Errors name the file and line, never the line's text.
fn parse_properties_file(path: &Path, text: &str) -> Result<Vec<Entry>, KafkaSettingsError> {
    let mut entries = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('!') {
            continue;
        }
        let origin = format!("{}:{}", path.display(), index + 1);
        entries.push(parse_entry(&origin, trimmed)?);
    }
    Ok(entries)
}

/// The bootstrap servers and the extra librdkafka properties of one process.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaSettings {
    pub bootstrap_servers: String,
    /// Extra librdkafka properties (`security.protocol`, `sasl.*`, `ssl.*`, …), in the order they
    /// are applied.
    pub properties: Vec<(String, String)>,
}

impl KafkaSettings {
    /// Settings from `KEY=VALUE` strings, as given on a command line. `refused` are the properties
    /// the caller sets itself beyond [`EXACTLY_ONCE_PROPERTIES`].
    pub fn new(
        bootstrap_servers: impl Into<String>,
        properties: &[String],
        refused: &[&str],
    ) -> Result<Self, KafkaSettingsError> {
        let entries = properties
            .iter()
            .enumerate()
            .map(|(index, property)| {
                parse_entry(&format!("--kafka-property {}", index + 1), property)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_entries(bootstrap_servers.into(), entries, refused)
    }

    fn from_entries(
        bootstrap_servers: String,
        entries: Vec<Entry>,
        refused: &[&str],
    ) -> Result<Self, KafkaSettingsError> {
        let mut properties: Vec<(String, String)> = Vec::with_capacity(entries.len());
        for Entry { origin, key, value } in entries {
            if EXACTLY_ONCE_PROPERTIES.contains(&key.as_str()) || refused.contains(&key.as_str()) {
                return Err(KafkaSettingsError::Refused { origin, key });
            }
            if key.contains(['\n', '\r']) || value.contains(['\n', '\r']) {
                return Err(KafkaSettingsError::MultiLine { origin, key });
            }
            // A later source overrides an earlier one: keep one entry per key.
            properties.retain(|(existing, _)| *existing != key);
            properties.push((key, value));
        }
        Ok(Self {
            bootstrap_servers,
            properties,
        })
    }

    /// A client configuration with the bootstrap servers and the extra properties; every Kafka
    /// client of the process starts from it and then sets what exactly-once depends on.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap_servers);
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        config
    }

    /// The extra properties' keys, for logs: values are never logged.
    pub fn property_keys(&self) -> Vec<&str> {
        self.properties
            .iter()
            .map(|(key, _)| key.as_str())
            .collect()
    }

    /// Writes the extra properties to a new file at `path`, readable by its owner only (0600),
    /// for the Kafka services this process starts: [`ChildKafkaProperties::apply_to`] points a
    /// child's environment at it, and dropping the guard removes the file.
    pub fn write_for_children(&self, path: &Path) -> std::io::Result<ChildKafkaProperties> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut text = String::from(
            "# The Kafka client properties of the program that started this service; removed when \
             it ends.\n",
        );
        for (key, value) in &self.properties {
            text.push_str(&format!("{key}={value}\n"));
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        let guard = ChildKafkaProperties {
            path: path.to_owned(),
        };
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        Ok(guard)
    }

    /// Logs what a service connects with at start-up: the servers and the property keys.
    pub fn log_at_start(&self) {
        tracing::info!(
            bootstrap_servers = %self.bootstrap_servers,
            properties = ?self.property_keys(),
            "Kafka client settings (property values are not logged)"
        );
    }
}

/// A properties file written for child Kafka services (see
/// [`KafkaSettings::write_for_children`]); removed on drop.
#[derive(Debug)]
pub struct ChildKafkaProperties {
    path: PathBuf,
}

impl ChildKafkaProperties {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Gives `command` these properties: `EOS_KAFKA_PROPERTIES_FILE` names the file, and an
    /// inherited `EOS_KAFKA_PROPERTIES` is removed (the file already holds what it said, and it
    /// would override what `-X` overrode in the parent).
    pub fn apply_to(&self, command: &mut Command) {
        command
            .env(PROPERTIES_FILE_ENV, &self.path)
            .env_remove(PROPERTIES_LIST_ENV);
    }
}

impl Drop for ChildKafkaProperties {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether a property's value is a secret (or holds one) and is shown as `<redacted>`.
pub fn is_secret_property(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password")
        || key.contains("secret")
        || key.contains("ssl.key")
        || key.starts_with("ssl.keystore")
        || key == "sasl.oauthbearer.config"
}

impl fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let properties: Vec<(&str, &str)> = self
            .properties
            .iter()
            .map(|(key, value)| {
                let shown = if is_secret_property(key) {
                    "<redacted>"
                } else {
                    value.as_str()
                };
                (key.as_str(), shown)
            })
            .collect();
        f.debug_struct("KafkaSettings")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("properties", &properties)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        kafka: KafkaFlags,
    }

    fn flags(args: &[&str]) -> KafkaFlags {
        Cli::try_parse_from(std::iter::once("svc").chain(args.iter().copied()))
            .expect("flags parse")
            .kafka
    }

    /// A properties file in the system temp dir, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn with(text: &str) -> Self {
            let path = std::env::temp_dir().join(format!(
                "eos-kafka-properties-{}-{:?}.properties",
                std::process::id(),
                std::thread::current().id()
            ));
            let mut file = std::fs::File::create(&path).expect("create temp file");
            file.write_all(text.as_bytes()).expect("write temp file");
            Self(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn librdkafka_is_built_with_tls_and_sasl_plain_and_scram() {
        // A ClientConfig holds only what was set: librdkafka's own configuration has the default.
        let features = ClientConfig::new()
            .create_native_config()
            .and_then(|native| native.get("builtin.features"))
            .expect("librdkafka reports builtin.features");
        let features: Vec<&str> = features.split(',').collect();
        for needed in ["ssl", "sasl_plain", "sasl_scram"] {
            assert!(
                features.contains(&needed),
                "librdkafka lacks {needed}: builtin.features = {features:?}"
            );
        }
        let (_, version) = rdkafka::util::get_rdkafka_version();
        assert!(version.starts_with("2."), "librdkafka {version}");
    }

    #[test]
    fn properties_from_flag_list_and_file_reach_the_client_config() -> anyhow::Result<()> {
        let file = TempFile::with(
            "# credentials for the pipeline's Kafka user\n\
             ! another comment style\n\
             \n\
             security.protocol = SASL_SSL\n\
             sasl.mechanism=SCRAM-SHA-512\n\
             sasl.password=p=w;rd\n\
             socket.timeout.ms=1000\n",
        );
        let path = file.0.to_str().expect("utf-8 temp path");
        let settings = flags(&[
            "--bootstrap-servers",
            "broker:9093",
            "--kafka-properties-file",
            path,
            "--kafka-properties",
            "ssl.ca.location=/ca.pem;socket.timeout.ms=2000\nsasl.username=pipeline",
            "-X",
            "socket.timeout.ms=3000",
            "--kafka-property",
            "client.id=a=b",
        ])
        .settings(&[])?;
        let config = settings.client_config();
        assert_eq!(config.get("bootstrap.servers"), Some("broker:9093"));
        assert_eq!(config.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(config.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        // A file value may hold ';' and '=': only the first '=' splits.
        assert_eq!(config.get("sasl.password"), Some("p=w;rd"));
        assert_eq!(config.get("ssl.ca.location"), Some("/ca.pem"));
        assert_eq!(config.get("sasl.username"), Some("pipeline"));
        assert_eq!(config.get("client.id"), Some("a=b"));
        // File, then list, then -X: the last one wins.
        assert_eq!(config.get("socket.timeout.ms"), Some("3000"));
        assert_eq!(
            settings.property_keys(),
            [
                "security.protocol",
                "sasl.mechanism",
                "sasl.password",
                "ssl.ca.location",
                "sasl.username",
                "socket.timeout.ms",
                "client.id"
            ]
        );
        Ok(())
    }

    #[test]
    fn no_properties_means_only_the_bootstrap_servers() -> anyhow::Result<()> {
        let settings = flags(&[]).settings(&[])?;
        assert_eq!(settings.bootstrap_servers, "127.0.0.1:9092");
        assert!(settings.properties.is_empty());
        Ok(())
    }

    #[test]
    fn settings_exactly_once_depends_on_are_refused_from_every_source() {
        for property in [
            "enable.idempotence=false",
            "isolation.level=read_uncommitted",
            " acks =1",
            "enable.auto.commit=true",
            "group.id=other",
            "transactional.id=t",
            "bootstrap.servers=elsewhere:9092",
        ] {
            let error = flags(&["-X", property]).settings(&[]).expect_err(property);
            assert!(
                matches!(&error, KafkaSettingsError::Refused { origin, .. } if origin == "--kafka-property 1"),
                "{property}: {error}"
            );
        }
        let error = flags(&["--kafka-properties", "linger.ms=5;group.id=x"])
            .settings(&[])
            .expect_err("refused in the list");
        assert!(
            matches!(&error, KafkaSettingsError::Refused { origin, key } if origin == "EOS_KAFKA_PROPERTIES entry 2" && key == "group.id"),
            "{error}"
        );
        let file = TempFile::with("linger.ms=5\n\nisolation.level=read_uncommitted\n");
        let path = file.0.to_str().expect("utf-8 temp path");
        let error = flags(&["--kafka-properties-file", path])
            .settings(&[])
            .expect_err("refused in the file");
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("{path}:3: isolation.level cannot be overridden")),
            "{message}"
        );
    }

    #[test]
    fn a_service_refuses_its_own_extra_properties_too() -> anyhow::Result<()> {
        let flags = flags(&["-X", "message.timeout.ms=1000"]);
        assert!(flags.settings(&[]).is_ok());
        let error = flags
            .settings(&["message.timeout.ms"])
            .expect_err("refused for this service");
        assert!(
            error
                .to_string()
                .contains("message.timeout.ms cannot be overridden"),
            "{error}"
        );
        Ok(())
    }

    #[test]
    fn malformed_entries_are_refused_without_showing_their_values() {
        let error = flags(&["-X", "sasl.password:hunter2"])
            .settings(&[])
            .expect_err("no '='");
        let message = error.to_string();
        assert!(matches!(error, KafkaSettingsError::NotKeyValue { .. }));
        assert!(message.contains("--kafka-property 1"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");

        assert!(matches!(
            flags(&["-X", "=value"]).settings(&[]),
            Err(KafkaSettingsError::NotKeyValue { .. })
        ));
        let file = TempFile::with("sasl.username=u\nsasl.password hunter2\n");
        let path = file.0.to_str().expect("utf-8 temp path");
        let message = flags(&["--kafka-properties-file", path])
            .settings(&[])
            .expect_err("bad line")
            .to_string();
        assert!(message.starts_with(&format!("{path}:2 ")), "{message}");
        assert!(!message.contains("hunter2"), "{message}");

        let missing = flags(&["--kafka-properties-file", "/nonexistent/kafka.properties"])
            .settings(&[])
            .expect_err("missing file");
        assert!(matches!(missing, KafkaSettingsError::ReadFile { .. }));
    }

    /// Issue 50: a missing '=' glues the secret to the key (`sasl.passwordSECRET`), so no part of
    /// a malformed entry is shown: only where it is.
    #[test]
    fn a_malformed_entry_is_named_by_its_position_never_its_text() {
        let message = flags(&[
            "--kafka-properties",
            "security.protocol=SSL;sasl.passwordSECRET",
        ])
        .settings(&[])
        .expect_err("no '='")
        .to_string();
        assert!(!message.contains("SECRET"), "{message}");
        assert!(
            message.contains("EOS_KAFKA_PROPERTIES entry 2"),
            "{message}"
        );
        let message = flags(&["-X", "a=b", "-X", "sasl.passwordSECRET"])
            .settings(&[])
            .expect_err("no '='")
            .to_string();
        assert!(!message.contains("SECRET"), "{message}");
        assert!(message.contains("--kafka-property 2"), "{message}");
    }

    #[test]
    fn children_get_the_same_properties_through_an_owner_only_file() -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;

        let parent = flags(&[
            "--bootstrap-servers",
            "broker:9093",
            "--kafka-properties",
            "security.protocol=SASL_SSL;socket.timeout.ms=1000",
            "-X",
            "sasl.password=p=w;rd#1",
            "-X",
            "socket.timeout.ms=2000",
        ])
        .settings(&[])?;
        let path = std::env::temp_dir().join(format!(
            "eos-kafka-child-{}-{:?}.properties",
            std::process::id(),
            std::thread::current().id()
        ));
        let child_file = parent.write_for_children(&path)?;
        let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "only the owner reads the secrets");

        // What a child reads from its environment: the file, not the parent's list.
        let mut command = Command::new("true");
        command.env(PROPERTIES_LIST_ENV, "socket.timeout.ms=1");
        child_file.apply_to(&mut command);
        let envs: Vec<_> = command.get_envs().collect();
        assert!(
            envs.contains(&(PROPERTIES_LIST_ENV.as_ref(), None)),
            "{envs:?}"
        );
        assert!(
            envs.contains(&(PROPERTIES_FILE_ENV.as_ref(), Some(path.as_os_str()))),
            "{envs:?}"
        );
        let child = flags(&[
            "--bootstrap-servers",
            "broker:9093",
            "--kafka-properties-file",
            path.to_str().expect("utf-8 temp path"),
        ])
        .settings(&[])?;
        assert_eq!(
            child, parent,
            "the child connects exactly as the parent does"
        );

        drop(child_file);
        assert!(!path.exists(), "the file goes with its guard");

        let error = flags(&["-X", "sasl.password=a\nsecurity.protocol=PLAINTEXT"])
            .settings(&[])
            .expect_err("a value with a line break would inject a property");
        assert!(
            matches!(&error, KafkaSettingsError::MultiLine { key, .. } if key == "sasl.password"),
            "{error}"
        );
        assert!(!error.to_string().contains("PLAINTEXT"), "{error}");
        Ok(())
    }

    #[test]
    fn debug_and_help_show_no_secret() -> anyhow::Result<()> {
        let settings = KafkaSettings::new(
            "b:9092",
            &[
                "sasl.password=hunter2".to_owned(),
                "ssl.key.pem=PRIVATE".to_owned(),
                "ssl.key.password=keypass".to_owned(),
                "security.protocol=SASL_SSL".to_owned(),
            ],
            &[],
        )?;
        let shown = format!("{settings:?}");
        for secret in ["hunter2", "PRIVATE", "keypass"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("SASL_SSL"), "{shown}");

        use clap::CommandFactory as _;
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("EOS_KAFKA_PROPERTIES"), "{help}");
        assert!(help.contains("--kafka-properties-file"), "{help}");
        Ok(())
    }
}
