//! Throwaway certificates for one test cluster: a CA, the apiserver's serving
//! certificate (for `127.0.0.1` and `localhost`), a kube-scheduler client
//! certificate, and the ServiceAccount token signing key.

use std::path::{Path, PathBuf};

use anyhow::Result;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Files written by [`Pki::write`].
#[derive(Debug, Clone)]
pub struct Pki {
    /// CA certificate, PEM.
    pub ca_pem: String,
    /// `ca.crt`
    pub ca_cert: PathBuf,
    /// `apiserver.crt`
    pub serving_cert: PathBuf,
    /// `apiserver.key`
    pub serving_key: PathBuf,
    /// `sa.key`: signs ServiceAccount tokens.
    pub sa_key: PathBuf,
    /// `sa.pub`: verifies them.
    pub sa_pub: PathBuf,
    /// `kube-scheduler-client.crt`: a client certificate (CN `kube-scheduler`) the CA signed,
    /// as kube-scheduler presents to an extender that asks for one.
    pub client_cert: PathBuf,
    /// `kube-scheduler-client.key`
    pub client_key: PathBuf,
}

impl Pki {
    /// Generates everything and writes it under `dir`.
    pub fn write(dir: &Path) -> Result<Pki> {
        std::fs::create_dir_all(dir)?;
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "fumarole-e2e-ca");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving = params.signed_by(&serving_key, &issuer)?;

        let client_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-scheduler");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client = params.signed_by(&client_key, &issuer)?;

        let sa_key = KeyPair::generate()?;

        let pki = Pki {
            ca_pem: ca_cert.pem(),
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
            client_cert: dir.join("kube-scheduler-client.crt"),
            client_key: dir.join("kube-scheduler-client.key"),
        };
        std::fs::write(&pki.ca_cert, &pki.ca_pem)?;
        std::fs::write(&pki.serving_cert, serving.pem())?;
        std::fs::write(&pki.serving_key, serving_key.serialize_pem())?;
        std::fs::write(&pki.sa_key, sa_key.serialize_pem())?;
        std::fs::write(&pki.sa_pub, sa_key.public_key_pem())?;
        std::fs::write(&pki.client_cert, client.pem())?;
        std::fs::write(&pki.client_key, client_key.serialize_pem())?;
        Ok(pki)
    }
}
