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

/// `url` with its whole userinfo (`user:password@`) replaced by [`REDACTED`], for a URL whose
/// user part is itself a credential (a provider's `token@host`), unlike a database role. A string
/// that does not parse as a URL is replaced whole, as [`redact_url`] does.
pub fn redact_url_userinfo(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if url_has_userinfo(url) {
                // Only fails for URLs that cannot have a user (no host), which this one has.
                let _ = parsed.set_password(None);
                let _ = parsed.set_username(REDACTED);
            }
            parsed.to_string()
        }
        Err(_) => "<a value that is not a URL, not shown>".to_owned(),
    }
}

/// Whether `url` carries a user name or a password (`user:password@host`).
pub fn url_has_userinfo(url: &str) -> bool {
    url::Url::parse(url)
        .is_ok_and(|parsed| !parsed.username().is_empty() || parsed.password().is_some())
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
/// `--database-url-file` / `DATABASE_URL_FILE`; and, for a URL without a password, the password
/// apart from it: `--database-password` / `DATABASE_PASSWORD`, or a file holding it,
/// `--database-password-file` / `DATABASE_PASSWORD_FILE`.
///
/// The password apart is what managed PostgreSQL operators hand out (a Secret with the role's
/// password under its own key, e.g. CloudNativePG's `<cluster>-app`), and it keeps the URL, which
/// names the host and the TLS settings, out of the Secret. It is put into the URL once, at
/// start-up; a URL that has a password already and a password flag is a usage error, since one
/// of the two would be ignored.
#[derive(Clone)]
pub struct DatabaseUrlFlags {
    /// The URL to connect with, the password put in.
    url: Secret,
}

/// The command-line flags [`DatabaseUrlFlags`] is built from.
#[derive(clap::Args)]
struct DatabaseUrlArgs {
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

    /// The password of the URL's role, for a URL without one (postgres://USER@HOST/DATABASE);
    /// put into the URL percent-encoded. Prefer --database-password-file: a password here is
    /// visible in the process list.
    #[arg(
        long,
        env = "DATABASE_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD",
        value_parser = parse_secret
    )]
    database_password: Option<Secret>,

    /// A file holding the password of the URL's role (a mounted secret's key), read once at
    /// start-up; surrounding whitespace is dropped.
    #[arg(
        long,
        env = "DATABASE_PASSWORD_FILE",
        value_name = "PATH",
        value_parser = parse_secret_file,
        conflicts_with = "database_password"
    )]
    database_password_file: Option<Secret>,
}

/// Why a password cannot be put into the database URL. No variant carries the URL or the
/// password.
#[derive(Debug, thiserror::Error)]
pub enum DatabasePasswordError {
    #[error(
        "the database URL has a password already: give the password either in the URL or with \
         --database-password / --database-password-file, not both"
    )]
    PasswordTwice,
    #[error(
        "a password needs a database URL of the form postgres://USER@HOST:PORT/DATABASE; this \
         one {0}"
    )]
    NoPlaceForPassword(&'static str),
}

/// `url` with `password` in its user info, percent-encoded the way sqlx decodes it, so any
/// character of a password survives. Refused when the URL has a password already (in its user
/// info or as a `password` query parameter, which sqlx reads too).
pub fn url_with_password(url: &str, password: &str) -> Result<String, DatabasePasswordError> {
    let mut parsed = url::Url::parse(url)
        .map_err(|_| DatabasePasswordError::NoPlaceForPassword("does not parse as a URL"))?;
    let password_in_query = parsed.query_pairs().any(|(key, _)| key == "password");
    if parsed.password().is_some() || password_in_query {
        return Err(DatabasePasswordError::PasswordTwice);
    }
    let encoded =
        percent_encoding::utf8_percent_encode(password, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
    parsed
        .set_password(Some(&encoded))
        .map_err(|()| DatabasePasswordError::NoPlaceForPassword("names no host"))?;
    Ok(parsed.into())
}

impl DatabaseUrlArgs {
    fn into_flags(self) -> Result<DatabaseUrlFlags, DatabasePasswordError> {
        let url = match (self.database_url, self.database_url_file) {
            (_, Some(from_file)) => from_file.0,
            (Some(url), None) => url,
            // clap requires one of the two.
            (None, None) => String::new(),
        };
        let url = match self.database_password.or(self.database_password_file) {
            Some(password) => url_with_password(&url, password.expose())?,
            None => url,
        };
        Ok(DatabaseUrlFlags { url: Secret(url) })
    }
}

impl clap::FromArgMatches for DatabaseUrlFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        DatabaseUrlArgs::from_arg_matches(matches)?
            .into_flags()
            .map_err(|error| {
                clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, error.to_string())
            })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for DatabaseUrlFlags {
    fn group_id() -> Option<clap::Id> {
        DatabaseUrlArgs::group_id()
    }

    fn augment_args(command: clap::Command) -> clap::Command {
        DatabaseUrlArgs::augment_args(command)
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        DatabaseUrlArgs::augment_args_for_update(command)
    }
}

impl DatabaseUrlFlags {
    /// A URL given directly (tests and tools that build the flags themselves).
    pub fn from_url(url: impl Into<String>) -> Self {
        Self {
            url: Secret(url.into()),
        }
    }

    /// The URL to connect with, the password included. Never log it; log
    /// [`DatabaseUrlFlags::redacted`].
    pub fn url(&self) -> &str {
        self.url.expose()
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
    use clap::{CommandFactory as _, FromArgMatches as _, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        database: DatabaseUrlFlags,
    }

    /// Parses as the binaries do, but without the environment: a developer's exported
    /// DATABASE_URL (the local stack's `env` prints it) would otherwise fill --database-url and
    /// clash with the flags a test gives.
    fn parse_without_env<I, T>(args: I) -> Result<Flags, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let command = Flags::command().mut_args(|arg| arg.env(None));
        Flags::from_arg_matches(&command.try_get_matches_from(args)?)
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
    fn a_whole_userinfo_is_redacted_where_the_user_is_a_credential_too() {
        let url = "http://USER-MARKER:PASSWORD-MARKER@provider.internal:8080/v1";
        assert!(url_has_userinfo(url));
        assert_eq!(
            redact_url_userinfo(url),
            "http://***@provider.internal:8080/v1"
        );
        assert!(url_has_userinfo("http://TOKEN@provider.internal/"));
        assert!(!redact_url_userinfo("http://TOKEN@provider.internal/").contains("TOKEN"));
        assert!(!url_has_userinfo("https://provider.internal/"));
        assert_eq!(
            redact_url_userinfo("https://provider.internal/"),
            "https://provider.internal/"
        );
    }

    #[test]
    fn the_url_comes_from_the_flag_or_from_a_file_never_both() {
        let flags =
            parse_without_env(["x", "--database-url", "postgres://u:MARKER@h/d"]).expect("flag");
        assert_eq!(flags.database.url(), "postgres://u:MARKER@h/d");
        assert!(!format!("{flags:?}").contains("MARKER"));

        let dir = std::env::temp_dir().join(format!("eos-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("database-url");
        std::fs::write(&file, "postgres://u:MARKER@h/d\n").expect("write");
        let path = file.to_str().expect("utf-8 path");
        let flags = parse_without_env(["x", "--database-url-file", path]).expect("file");
        assert_eq!(flags.database.url(), "postgres://u:MARKER@h/d");

        assert!(
            parse_without_env(["x", "--database-url", "a", "--database-url-file", path]).is_err()
        );
        std::fs::write(&file, "\n").expect("write");
        let error = parse_without_env(["x", "--database-url-file", path])
            .expect_err("empty file")
            .to_string();
        assert!(error.contains("is empty"), "{error}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// A password with every character that means something in a URL, and one outside ASCII.
    const AWKWARD_PASSWORD: &str = "p@ss:w/rd?#%41 &+=;[]\u{e9}";

    fn password_in(url: &str) -> String {
        let parsed = url::Url::parse(url).expect("a URL");
        let encoded = parsed.password().expect("a password in the URL");
        percent_encoding::percent_decode_str(encoded)
            .decode_utf8()
            .expect("utf-8")
            .into_owned()
    }

    /// A scratch directory of this test process, removed by the test.
    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("eos-secret-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    #[test]
    fn a_password_apart_is_put_into_a_url_that_has_none() {
        let url = "postgres://app@db.example:5432/eos?sslmode=verify-full&sslrootcert=/etc/ca.crt";
        let flags = parse_without_env([
            "x",
            "--database-url",
            url,
            "--database-password",
            AWKWARD_PASSWORD,
        ])
        .expect("flags");
        let with_password = url::Url::parse(flags.database.url()).expect("a URL");
        assert_eq!(password_in(flags.database.url()), AWKWARD_PASSWORD);
        assert_eq!(with_password.username(), "app");
        assert_eq!(with_password.host_str(), Some("db.example"));
        assert_eq!(with_password.port(), Some(5432));
        assert_eq!(with_password.path(), "/eos");
        assert_eq!(
            with_password.query(),
            Some("sslmode=verify-full&sslrootcert=/etc/ca.crt")
        );
        assert_eq!(
            flags.database.redacted(),
            "postgres://app:***@db.example:5432/eos?sslmode=verify-full&sslrootcert=/etc/ca.crt"
        );
        assert!(!format!("{flags:?}").contains("p@ss"), "{flags:?}");

        // Without a password flag the URL is used as it is.
        let flags = parse_without_env(["x", "--database-url", url]).expect("flags");
        assert_eq!(flags.database.url(), url);
    }

    #[test]
    fn the_password_file_is_read_once_at_start_up_without_its_newline() {
        let dir = scratch_dir("password");
        let url_file = dir.join("database-url");
        let password_file = dir.join("password");
        std::fs::write(&url_file, "postgres://app@db/eos\n").expect("write");
        std::fs::write(&password_file, format!("{AWKWARD_PASSWORD}\n")).expect("write");
        let flags = parse_without_env([
            "x",
            "--database-url-file",
            url_file.to_str().expect("utf-8 path"),
            "--database-password-file",
            password_file.to_str().expect("utf-8 path"),
        ])
        .expect("flags");
        // Changing the file afterwards changes nothing: it was read at start-up.
        std::fs::write(&password_file, "another\n").expect("write");
        assert_eq!(password_in(flags.database.url()), AWKWARD_PASSWORD);

        std::fs::write(&password_file, " \n").expect("write");
        let error = parse_without_env([
            "x",
            "--database-url",
            "postgres://app@db/eos",
            "--database-password-file",
            password_file.to_str().expect("utf-8 path"),
        ])
        .expect_err("an empty password file")
        .to_string();
        assert!(error.contains("is empty"), "{error}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_password_in_the_url_and_apart_is_a_usage_error_that_shows_neither() {
        for url in [
            "postgres://app:URLSECRET@db/eos",
            "postgres://app@db/eos?sslmode=require&password=URLSECRET",
        ] {
            let error = parse_without_env([
                "x",
                "--database-url",
                url,
                "--database-password",
                "FLAGSECRET",
            ])
            .expect_err("a password twice");
            assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
            let message = error.to_string();
            assert!(message.contains("has a password already"), "{message}");
            assert!(
                !message.contains("URLSECRET") && !message.contains("FLAGSECRET"),
                "{message}"
            );
        }
    }

    #[test]
    fn the_password_comes_from_the_flag_or_from_a_file_never_both() {
        let dir = scratch_dir("password-twice");
        let password_file = dir.join("password");
        std::fs::write(&password_file, "from-file\n").expect("write");
        let error = parse_without_env([
            "x",
            "--database-url",
            "postgres://app@db/eos",
            "--database-password",
            "from-flag",
            "--database-password-file",
            password_file.to_str().expect("utf-8 path"),
        ])
        .expect_err("both");
        assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_password_needs_a_url_with_a_host() {
        for (url, says) in [
            // A libpq key=value connection string is not a URL.
            (
                "host=db.example user=app dbname=eos",
                "does not parse as a URL",
            ),
            ("postgres:///eos?host=/run/postgresql", "names no host"),
        ] {
            let message =
                parse_without_env(["x", "--database-url", url, "--database-password", "pw"])
                    .expect_err("no place for the password")
                    .to_string();
            assert!(message.contains(says), "{url}: {message}");
        }
    }
}
