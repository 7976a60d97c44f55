//! Secrets the services are given, and keeping them out of what they print.
//!
//! A secret may come from a file (`*_FILE`: Docker and Kubernetes mount secrets as files) so it
//! is on no command line and in no environment listing. A URL that may carry a password is
//! passed through [`redact_url`] before it reaches a log line, an error, `/boundary` or `--help`
//! (the flags set `hide_env_values`).

use std::fmt;
use std::path::{Path, PathBuf};

/// What a redacted password reads as.
pub const REDACTED: &str = "***";

/// `url` with its password replaced by [`REDACTED`]. A string that does not parse as a URL is
/// replaced whole: it might be a password pasted into the wrong place.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                // Only fails for URLs that cannot have a password, which this one has.
                let _ = parsed.set_password(Some(REDACTED));
            }
            parsed.to_string()
        }
        Err(_) => "<a value that is not a URL, not shown>".to_owned(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    #[error("cannot read the secret file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the secret file {path} is empty")]
    Empty { path: PathBuf },
}

/// The file's contents without surrounding whitespace (the newline editors and `echo` add).
pub fn read_secret_file(path: &Path) -> Result<String, SecretFileError> {
    let contents = std::fs::read_to_string(path).map_err(|source| SecretFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let trimmed = contents.trim();
    if trimmed.is_empty() {
        return Err(SecretFileError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(trimmed.to_owned())
}

/// A secret string whose `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// clap value parser of a flag whose value is a secret (pair it with `hide_env_values`).
pub fn parse_secret(value: &str) -> Result<Secret, String> {
    if value.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(Secret(value.trim().to_owned()))
}

/// clap value parser of a `*_FILE` flag: reads the file at start-up, so a missing or empty file
/// is a usage error naming the flag.
pub fn parse_secret_file(path: &str) -> Result<Secret, String> {
    read_secret_file(Path::new(path))
        .map(Secret)
        .map_err(|e| e.to_string())
}

/// The PostgreSQL URL of a service: `--database-url` / `DATABASE_URL`, or a file holding it,
/// `--database-url-file` / `DATABASE_URL_FILE`.
#[derive(Clone, clap::Args)]
pub struct DatabaseUrlFlags {
    /// PostgreSQL URL, postgres://USER:PASSWORD@HOST:PORT/DATABASE (sslmode and sslrootcert
    /// query parameters are honoured). Prefer --database-url-file: a URL here is visible in the
    /// process list.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        value_name = "URL",
        required_unless_present = "database_url_file"
    )]
    database_url: Option<String>,

    /// A file holding the PostgreSQL URL (a mounted secret), read once at start-up.
    #[arg(
        long,
        env = "DATABASE_URL_FILE",
        value_name = "PATH",
        value_parser = parse_secret_file,
        conflicts_with = "database_url"
    )]
    database_url_file: Option<Secret>,
}

impl DatabaseUrlFlags {
    /// A URL given directly (tests and tools that build the flags themselves).
    pub fn from_url(url: impl Into<String>) -> Self {
        Self {
            database_url: Some(url.into()),
            database_url_file: None,
        }
    }

    /// The URL to connect with. Never log it; log [`DatabaseUrlFlags::redacted`].
    pub fn url(&self) -> &str {
        match (&self.database_url, &self.database_url_file) {
            (_, Some(from_file)) => from_file.expose(),
            (Some(url), None) => url,
            // clap requires one of the two; a value built by hand without either is empty.
            (None, None) => "",
        }
    }

    /// The URL with its password replaced, for logs and errors.
    pub fn redacted(&self) -> String {
        redact_url(self.url())
    }
}

impl fmt::Debug for DatabaseUrlFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseUrlFlags")
            .field("url", &self.redacted())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        database: DatabaseUrlFlags,
    }

    #[test]
    fn passwords_are_redacted_and_the_rest_kept() {
        assert_eq!(
            redact_url("postgres://eos:MARKER@127.0.0.1:5432/eos?sslmode=require"),
            "postgres://eos:***@127.0.0.1:5432/eos?sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://eos@127.0.0.1/eos"),
            "postgres://eos@127.0.0.1/eos"
        );
        assert!(!redact_url("MARKER is not a url").contains("MARKER"));
    }

    #[test]
    fn the_url_comes_from_the_flag_or_from_a_file_never_both() {
        let flags = Flags::try_parse_from(["x", "--database-url", "postgres://u:MARKER@h/d"])
            .expect("flag");
        assert_eq!(flags.database.url(), "postgres://u:MARKER@h/d");
        assert!(!format!("{flags:?}").contains("MARKER"));

        let dir = std::env::temp_dir().join(format!("eos-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("database-url");
        std::fs::write(&file, "postgres://u:MARKER@h/d\n").expect("write");
        let path = file.to_str().expect("utf-8 path");
        let flags = Flags::try_parse_from(["x", "--database-url-file", path]).expect("file");
        assert_eq!(flags.database.url(), "postgres://u:MARKER@h/d");

        assert!(
            Flags::try_parse_from(["x", "--database-url", "a", "--database-url-file", path])
                .is_err()
        );
        std::fs::write(&file, "\n").expect("write");
        let error = Flags::try_parse_from(["x", "--database-url-file", path])
            .expect_err("empty file")
            .to_string();
        assert!(error.contains("is empty"), "{error}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
