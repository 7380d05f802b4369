//! TLS for the tests: a CA and a server certificate for `127.0.0.1` and `localhost` made with
//! rcgen, written as PEM files into a temp dir of the test's own, and the rustls configs of a
//! server that presents the certificate and a client that trusts the CA.

use std::{path::PathBuf, sync::Arc};

use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::{
    ClientConfig, RootCertStore, ServerConfig,
    crypto::{CryptoProvider, ring},
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
};

use super::temp::temp_dir;

/// A test CA and a server certificate it signed, as PEM files and as rustls configs.
pub struct TestCerts {
    /// The temp dir that holds the files.
    pub dir: PathBuf,
    /// The CA's certificate (what `--ca-cert` names).
    pub ca_pem: PathBuf,
    /// The server's certificate, then the CA's (what `--tls-cert` names).
    pub cert_pem: PathBuf,
    /// The server's private key, PKCS#8 (what `--tls-key` names).
    pub key_pem: PathBuf,
    ca: CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: Vec<u8>,
    /// The CA, to issue client certificates (none for a certificate that is its own CA).
    issuer: Option<Arc<CertifiedIssuer<'static, KeyPair>>>,
}

/// The names the server certificate is for by default.
pub const SERVER_NAMES: [&str; 2] = ["127.0.0.1", "localhost"];

impl TestCerts {
    /// A new CA and a certificate for `127.0.0.1` and `localhost`, valid now.
    pub fn generate(name: &str) -> TestCerts {
        Self::issue(name, &SERVER_NAMES, false)
    }

    /// A certificate for other names only: a client of `127.0.0.1` must refuse it.
    pub fn for_names(name: &str, names: &[&str]) -> TestCerts {
        Self::issue(name, names, false)
    }

    /// A certificate for `127.0.0.1` and `localhost` that expired years ago.
    pub fn expired(name: &str) -> TestCerts {
        Self::issue(name, &SERVER_NAMES, true)
    }

    /// One self-signed certificate marked CA (`CA:TRUE`) for `127.0.0.1` and `localhost`,
    /// presented as the server's own and named as the CA: what TLS refuses
    /// (`CaUsedAsEndEntity`), however it is trusted.
    pub fn ca_as_server(name: &str) -> TestCerts {
        let names: Vec<String> = SERVER_NAMES.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "mcp-replay-guard test CA as server");
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let dir = temp_dir("tls", name);
        let ca_pem = dir.join("ca.pem");
        let key_pem = dir.join("server.key");
        std::fs::write(&ca_pem, cert.pem()).unwrap();
        std::fs::write(&key_pem, key.serialize_pem()).unwrap();
        TestCerts {
            dir,
            cert_pem: ca_pem.clone(),
            ca_pem,
            key_pem,
            ca: cert.der().clone(),
            chain: vec![cert.der().clone()],
            key: key.serialize_der(),
            issuer: None,
        }
    }

    fn issue(name: &str, names: &[&str], expired: bool) -> TestCerts {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(
            DnType::CommonName,
            format!("mcp-replay-guard test CA {name}"),
        );
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();

        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "mcp-replay-guard test server");
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca).unwrap();

        let dir = temp_dir("tls", name);
        let ca_pem = dir.join("ca.pem");
        let cert_pem = dir.join("server.pem");
        let key_pem = dir.join("server.key");
        std::fs::write(&ca_pem, ca.pem()).unwrap();
        std::fs::write(&cert_pem, format!("{}{}", cert.pem(), ca.pem())).unwrap();
        std::fs::write(&key_pem, key.serialize_pem()).unwrap();
        TestCerts {
            dir,
            ca_pem,
            cert_pem,
            key_pem,
            ca: ca.der().clone(),
            chain: vec![cert.der().clone(), ca.der().clone()],
            key: key.serialize_der(),
            issuer: Some(Arc::new(ca)),
        }
    }

    /// A client that trusts this CA and presents a client certificate for `common_name` that
    /// this CA signed (HTTPS only, HTTP/1.1).
    pub fn https_client_as(
        &self,
        common_name: &str,
    ) -> Client<HttpsConnector<HttpConnector>, Full<bytes::Bytes>> {
        self.https_client_with(common_name, None)
    }

    /// [`Self::https_client_as`], the certificate naming `uri` as a subject alternative name
    /// too (a SPIFFE ID, say).
    pub fn https_client_with(
        &self,
        common_name: &str,
        uri: Option<&str>,
    ) -> Client<HttpsConnector<HttpConnector>, Full<bytes::Bytes>> {
        let issuer = self.issuer.as_ref().expect("a CA that issues");
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        if let Some(uri) = uri {
            params
                .subject_alt_names
                .push(rcgen::SanType::URI(uri.try_into().unwrap()));
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, issuer).unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .build();
        Client::builder(TokioExecutor::new()).build(connector)
    }

    /// `--ca-cert PATH` as arguments.
    pub fn ca_cert_arg(&self) -> [String; 2] {
        [
            "--ca-cert".to_owned(),
            self.ca_pem.to_string_lossy().into_owned(),
        ]
    }

    /// A server that presents the certificate, HTTP/1.1 and h2 by ALPN.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// A client that trusts this CA only.
    pub fn client_config(&self) -> ClientConfig {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth()
    }

    /// A hyper-rustls connector that trusts this CA only (HTTPS only, HTTP/1.1).
    pub fn https_connector(&self) -> HttpsConnector<HttpConnector> {
        HttpsConnectorBuilder::new()
            .with_tls_config(self.client_config())
            .https_only()
            .enable_http1()
            .build()
    }

    /// A plain hyper client over [`Self::https_connector`].
    pub fn https_client(&self) -> Client<HttpsConnector<HttpConnector>, Full<bytes::Bytes>> {
        Client::builder(TokioExecutor::new()).build(self.https_connector())
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}
