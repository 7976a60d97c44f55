//! A certificate authority made in the test, and certificates it issues for 127.0.0.1 and
//! localhost, written as PEM files the services read (`--tls-cert`, `provider_ca_file`, …).

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

/// A CA's certificate file and its signing key.
#[derive(Debug)]
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
    pub cert_file: PathBuf,
}

/// A certificate and key issued by a [`TestCa`], as files.
#[derive(Debug, Clone)]
pub struct IssuedCert {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TestCa {
    /// A new CA whose files are written in `dir`.
    pub fn new(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "eos-suite test CA");
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let cert_file = dir.join("ca.pem");
        std::fs::write(&cert_file, issuer.pem())?;
        Ok(Self {
            issuer,
            dir: dir.to_owned(),
            cert_file,
        })
    }

    /// A certificate for `names` (DNS names or IP addresses), written as `<stem>.pem` and
    /// `<stem>-key.pem`. Server and client use alike.
    pub fn issue(&self, stem: &str, names: &[&str]) -> anyhow::Result<IssuedCert> {
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, stem);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let cert_file = self.dir.join(format!("{stem}.pem"));
        let key_file = self.dir.join(format!("{stem}-key.pem"));
        std::fs::write(&cert_file, cert.pem())?;
        std::fs::write(&key_file, key.serialize_pem())?;
        Ok(IssuedCert {
            cert_file,
            key_file,
        })
    }
}
