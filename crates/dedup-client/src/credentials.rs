//! Credentials for dedup-service's gRPC link, on both ends: bearer tokens (from a flag, an env
//! var or a `*_FILE`), their constant-time comparison, and the client's TLS settings (CA, client
//! certificate for mTLS, domain name override).
//!
//! A token is a shared secret, so it never appears in `Debug`, `Display` or an error message;
//! only its source (flag, file path) does.

use std::fmt;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::state_machine::constant_time_eq;

/// Shortest token accepted: 16 characters (with a random token, 96+ bits) keeps guessing out of
/// reach; anything shorter is a placeholder someone forgot to replace.
pub const MIN_TOKEN_LEN: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what}: {problem}")]
    Invalid { what: String, problem: String },
}

impl CredentialError {
    fn invalid(what: impl Into<String>, problem: impl Into<String>) -> Self {
        Self::Invalid {
            what: what.into(),
            problem: problem.into(),
        }
    }
}

/// The command-line flags of the client's TLS settings, one definition for every caller of
/// dedup-service (sink-writer, `eosctl held resolve`), so their names and env vars agree.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DedupTlsFlags {
    /// PEM CA that dedup-service's certificate must chain to; required for an https://
    /// dedup-service URL.
    #[arg(long, env = "EOS_DEDUP_TLS_CA", value_name = "PATH")]
    pub dedup_tls_ca: Option<PathBuf>,

    /// PEM client certificate for dedup-service's mTLS (its --tls-client-ca), with
    /// --dedup-tls-key.
    #[arg(
        long,
        env = "EOS_DEDUP_TLS_CERT",
        value_name = "PATH",
        requires = "dedup_tls_key"
    )]
    pub dedup_tls_cert: Option<PathBuf>,

    /// PEM private key of --dedup-tls-cert.
    #[arg(
        long,
        env = "EOS_DEDUP_TLS_KEY",
        value_name = "PATH",
        requires = "dedup_tls_cert"
    )]
    pub dedup_tls_key: Option<PathBuf>,

    /// Name to verify dedup-service's certificate against, when it is not the URL's host.
    #[arg(long, env = "EOS_DEDUP_TLS_DOMAIN")]
    pub dedup_tls_domain: Option<String>,
}

impl DedupTlsFlags {
    pub fn files(&self) -> ClientTlsFiles {
        ClientTlsFiles {
            ca: self.dedup_tls_ca.clone(),
            cert: self.dedup_tls_cert.clone(),
            key: self.dedup_tls_key.clone(),
            domain: self.dedup_tls_domain.clone(),
        }
    }
}

/// A bearer token. Compared by its SHA-256 digest in constant time; never printed.
#[derive(Clone)]
pub struct BearerToken {
    value: String,
    digest: [u8; 32],
}

impl BearerToken {
    /// Checks that `value` can travel as an `authorization` header and is long enough.
    /// `what` names the source for the error (e.g. "--client-token-file /run/x, line 2"); the
    /// value itself is never part of an error.
    pub fn new(value: &str, what: &str) -> Result<Self, CredentialError> {
        let value = value.trim();
        if value.len() < MIN_TOKEN_LEN {
            return Err(CredentialError::invalid(
                what,
                format!("a token must be at least {MIN_TOKEN_LEN} characters"),
            ));
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(CredentialError::invalid(
                what,
                "a token must be printable ASCII without spaces",
            ));
        }
        Ok(Self {
            digest: Sha256::digest(value.as_bytes()).into(),
            value: value.to_owned(),
        })
    }

    /// Whether `presented` is this token. Both sides are hashed first, so the comparison takes
    /// the same time whatever the lengths and wherever the values differ.
    pub fn matches(&self, presented: &str) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        constant_time_eq(&self.digest, &presented)
    }

    /// The token itself, for comparing two configured tokens. Never log it.
    pub fn expose(&self) -> &str {
        &self.value
    }

    /// `Bearer <token>`, the `authorization` metadata value.
    pub fn authorization(&self) -> AsciiMetadataValue {
        let mut header = MetadataValue::try_from(format!("Bearer {}", self.value))
            .expect("checked printable ASCII in BearerToken::new");
        header.set_sensitive(true);
        header
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// The token in an `authorization: Bearer …` value, if it has that form.
pub fn bearer_of(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The trimmed contents of a secret file (a Kubernetes Secret volume, a Docker secret).
pub fn read_secret_file(path: &Path, what: &'static str) -> Result<String, CredentialError> {
    std::fs::read_to_string(path)
        .map(|contents| contents.trim().to_owned())
        .map_err(|source| CredentialError::Read {
            what,
            path: path.to_owned(),
            source,
        })
}

/// Tokens from flag/env values and from files, for rotation: several may be valid at once. A
/// file holds one token per line; blank lines and lines starting with `#` are skipped.
pub fn token_set(
    values: &[String],
    files: &[PathBuf],
    flag: &'static str,
) -> Result<Vec<BearerToken>, CredentialError> {
    let mut tokens = Vec::new();
    for (n, value) in values.iter().enumerate() {
        tokens.push(BearerToken::new(value, &format!("{flag} #{}", n + 1))?);
    }
    for path in files {
        let contents = read_secret_file(path, "token file")?;
        for (n, line) in contents.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            tokens.push(BearerToken::new(
                line,
                &format!("{flag}-file {}, line {}", path.display(), n + 1),
            )?);
        }
    }
    Ok(tokens)
}

/// The client's TLS settings for an `https://` dedup-service endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// PEM CA certificate(s) the server's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain, for servers that require mTLS (with `key`).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// The name to verify the server's certificate against, when it differs from the URL's host
    /// (e.g. connecting by IP address).
    pub domain: Option<String>,
}

impl ClientTlsFiles {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Reads the files into a tonic TLS configuration.
    pub fn load(&self) -> Result<ClientTlsConfig, CredentialError> {
        let read = |path: &Path, what: &'static str| {
            std::fs::read(path).map_err(|source| CredentialError::Read {
                what,
                path: path.to_owned(),
                source,
            })
        };
        let Some(ca) = &self.ca else {
            return Err(CredentialError::invalid(
                "dedup-service TLS",
                "an https:// endpoint needs a CA file (--dedup-tls-ca) to verify the server",
            ));
        };
        let mut tls =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca, "CA file")?));
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(Identity::from_pem(
                    read(cert, "client certificate")?,
                    read(key, "client key")?,
                ));
            }
            (None, None) => {}
            _ => {
                return Err(CredentialError::invalid(
                    "dedup-service TLS",
                    "a client certificate and its key go together",
                ));
            }
        }
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain.clone());
        }
        Ok(tls)
    }
}

/// Everything a client presents to dedup-service.
#[derive(Debug, Clone, Default)]
pub struct ClientCredentials {
    /// Sent as `authorization: Bearer …` with every call.
    pub token: Option<BearerToken>,
    /// Used for `https://` endpoints (and required by them).
    pub tls: ClientTlsFiles,
}

impl ClientCredentials {
    /// A token from a value (flag or env) or a file; both at once is refused as ambiguous.
    pub fn token_from(
        value: Option<&str>,
        file: Option<&Path>,
        flag: &'static str,
    ) -> Result<Option<BearerToken>, CredentialError> {
        match (value, file) {
            (Some(_), Some(_)) => Err(CredentialError::invalid(
                flag,
                format!("give {flag} or {flag}-file, not both"),
            )),
            (Some(value), None) => BearerToken::new(value, flag).map(Some),
            (None, Some(path)) => {
                let value = read_secret_file(path, "token file")?;
                BearerToken::new(&value, &format!("{flag}-file {}", path.display())).map(Some)
            }
            (None, None) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "client-token-0123456789";

    #[test]
    fn tokens_match_exactly_and_never_print() {
        let token = BearerToken::new(TOKEN, "--t").expect("valid");
        assert!(token.matches(TOKEN));
        assert!(!token.matches("client-token-0123456788"));
        assert!(
            !token.matches("client-token-012345678"),
            "a prefix is not the token"
        );
        assert!(!token.matches(""));
        assert!(!format!("{token:?}").contains(TOKEN));
        assert_eq!(
            token.authorization().to_str().expect("ascii"),
            format!("Bearer {TOKEN}")
        );
        assert!(token.authorization().is_sensitive());
    }

    #[test]
    fn short_or_unprintable_tokens_are_refused_without_echoing_them() {
        let error = BearerToken::new("changeme", "--client-token").expect_err("short");
        assert!(error.to_string().contains("--client-token"), "{error}");
        assert!(!error.to_string().contains("changeme"), "{error}");
        let error = BearerToken::new("a token with spaces inside", "--t").expect_err("space");
        assert!(error.to_string().contains("printable"), "{error}");
        assert!(
            BearerToken::new("  padded-token-0123456789\n", "--t").is_ok(),
            "trimmed"
        );
    }

    #[test]
    fn bearer_scheme_is_parsed_case_insensitively() {
        assert_eq!(bearer_of("Bearer abc"), Some("abc"));
        assert_eq!(bearer_of("bearer  abc "), Some("abc"));
        assert_eq!(bearer_of("Basic abc"), None);
        assert_eq!(bearer_of("Bearerabc"), None);
    }

    #[test]
    fn token_files_hold_one_token_per_line_for_rotation() {
        let dir = std::env::temp_dir().join(format!("dedup-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("tokens");
        std::fs::write(
            &file,
            "# old, retire after the rollout\nold-token-0123456789\n\n  new-token-0123456789  \n",
        )
        .expect("write");
        let tokens = token_set(
            &[TOKEN.to_owned()],
            std::slice::from_ref(&file),
            "--client-token",
        )
        .expect("valid tokens");
        assert_eq!(tokens.len(), 3);
        for presented in [TOKEN, "old-token-0123456789", "new-token-0123456789"] {
            assert!(tokens.iter().any(|t| t.matches(presented)), "{presented}");
        }
        std::fs::write(&file, "short\n").expect("write");
        let error = token_set(&[], std::slice::from_ref(&file), "--client-token")
            .expect_err("short token in a file");
        assert!(error.to_string().contains("line 1"), "{error}");

        std::fs::write(&file, "  file-token-0123456789\n").expect("write");
        let token = ClientCredentials::token_from(None, Some(&file), "--dedup-token")
            .expect("readable")
            .expect("a token");
        assert!(
            token.matches("file-token-0123456789"),
            "contents are trimmed"
        );
        assert!(
            ClientCredentials::token_from(Some(TOKEN), Some(&file), "--dedup-token").is_err(),
            "a value and a file at once are ambiguous"
        );
        let missing = ClientCredentials::token_from(None, Some(&dir.join("nope")), "--t")
            .expect_err("missing file");
        assert!(missing.to_string().contains("nope"), "{missing}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn https_needs_a_ca_and_a_cert_needs_its_key() {
        let error = ClientTlsFiles::default().load().expect_err("no CA");
        assert!(error.to_string().contains("--dedup-tls-ca"), "{error}");
        let half = ClientTlsFiles {
            ca: Some("/dev/null".into()),
            cert: Some("/dev/null".into()),
            ..ClientTlsFiles::default()
        };
        assert!(half.load().is_err());
    }
}
