//! A private public-key infrastructure generated per test (rcgen): a CA, a
//! server certificate for `127.0.0.1` and `localhost` signed by it, a client
//! certificate signed by it, and a second, unrelated CA that trusts none of
//! them. PEM files in a temporary directory.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use std::path::PathBuf;

/// The generated files, removed on drop.
pub struct Pki {
    dir: tempfile::TempDir,
    /// The server certificate (PEM) and its key (PEM, PKCS#8).
    pub server_cert_pem: String,
    /// The server certificate's private key (PEM).
    pub server_key_pem: String,
}

impl Pki {
    /// Generates everything and writes `ca.pem`, `server.pem`,
    /// `server-key.pem`, `client.pem`, `client-key.pem` and `other-ca.pem`.
    pub fn generate() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (ca_params, ca_key) = ca("idem test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate().unwrap();
        let mut server =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        server
            .distinguished_name
            .push(DnType::CommonName, "idem test server");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server.signed_by(&server_key, &issuer).unwrap();

        let client_key = KeyPair::generate().unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client
            .distinguished_name
            .push(DnType::CommonName, "idem test client");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client.signed_by(&client_key, &issuer).unwrap();

        let (other_params, other_key) = ca("unrelated CA");
        let other = other_params.self_signed(&other_key).unwrap();

        let pki = Pki {
            dir,
            server_cert_pem: server_cert.pem(),
            server_key_pem: server_key.serialize_pem(),
        };
        for (name, pem) in [
            ("ca.pem", ca_cert.pem()),
            ("server.pem", pki.server_cert_pem.clone()),
            ("server-key.pem", pki.server_key_pem.clone()),
            ("client.pem", client_cert.pem()),
            ("client-key.pem", client_key.serialize_pem()),
            ("other-ca.pem", other.pem()),
        ] {
            std::fs::write(pki.path(name), pem).unwrap();
        }
        pki
    }

    /// The path of one of the files [`Pki::generate`] wrote.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn ca(name: &str) -> (CertificateParams, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    (params, key)
}
