//! A throwaway certificate authority and one server certificate signed by it, for
//! trying TLS out on one machine (`stampfs dev --tls`, `stampfs bench pipeline --tls`,
//! the tests). A real cluster brings its own: any PEM certificate chain and key whose
//! certificate names the address the servers are dialed at will do.

use anyhow::{Context, Result};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use std::path::{Path, PathBuf};

/// The files [`generate`] writes.
#[derive(Clone, Debug)]
pub struct Pki {
    /// The authority's certificate: what dialers trust (`--tls-ca`).
    pub ca: PathBuf,
    /// The servers' certificate, issued by the authority (`--tls-cert`).
    pub cert: PathBuf,
    /// Its private key, mode 0600 (`--tls-key`).
    pub key: PathBuf,
}

/// Makes a new authority and a server certificate for `names` (IP addresses or DNS
/// names) in `dir`: `ca.pem`, `server.pem` and `server.key`. The authority's own key
/// is not kept, so nothing more can be issued under it.
pub fn generate(dir: &Path, names: &[&str]) -> Result<Pki> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "stampfs throwaway authority");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let server_key = KeyPair::generate()?;
    let server = CertificateParams::new(names)?.signed_by(&server_key, &ca)?;
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let pki = Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    };
    let write = |path: &Path, text: String| {
        std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
    };
    write(&pki.ca, ca.pem())?;
    write(&pki.cert, server.pem())?;
    stampfs_proto::token::write_private_file(
        &pki.key,
        server_key.serialize_pem().as_bytes(),
        false,
    )
    .with_context(|| format!("write {}", pki.key.display()))?;
    Ok(pki)
}

impl Pki {
    /// The server options naming these files (`--tls-cert`, `--tls-key`, `--tls-ca`).
    pub fn files(&self) -> stampfs_proto::net::TlsFiles {
        stampfs_proto::net::TlsFiles {
            tls_cert: Some(self.cert.clone()),
            tls_key: Some(self.key.clone()),
            tls_ca: Some(self.ca.clone()),
        }
    }
}
