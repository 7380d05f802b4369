//! HTTPS for `call` and `proxy`, on rustls with the ring provider: the client side
//! (`--ca-cert`, the platform's roots by default) and the proxy listener's (`--tls-cert`,
//! `--tls-key`).
//!
//! A request leaves only once the handshake is done (no TLS early data), so a handshake that
//! fails or never finishes is a connect error: the guard records the execution `not_sent`.

use std::{
    error::Error as StdError,
    fmt, io,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use anyhow::{Context as _, bail};
use clap::Args;
use http::Uri;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder, MaybeHttpsStream};
use hyper_util::{client::legacy::connect::HttpConnector, rt::TokioIo};
use rustls::{
    ClientConfig, RootCertStore, ServerConfig,
    crypto::{CryptoProvider, ring},
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::WebPkiClientVerifier,
};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_util::either::Either;
use tower::Service;

/// The longest a client connect (TCP and TLS handshake) may take, and a client's handshake
/// with the proxy's listener: a peer that stalls it holds nothing but its own connection.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a TLS failure suggests to the person running the command.
pub const CA_CERT_HINT: &str = "the TLS handshake failed: if the server's certificate is signed by a private CA, pass --ca-cert PATH (its CA certificate in PEM)";

/// What a server certificate that is a CA's (`CA:TRUE`) needs, which rustls refuses as a
/// server's own (trusting it with --ca-cert does not help).
pub const CA_AS_SERVER_HINT: &str = "the server's certificate is a CA certificate (basicConstraints CA:TRUE), which TLS refuses as a server's own even when --ca-cert names it: make the server a certificate of its own, signed by a CA (CA:FALSE, subjectAltName with the host or IP address of the URL, extendedKeyUsage serverAuth; `mkcert`, or `openssl x509 -req -CA ca.pem -CAkey ca.key` with those extensions, makes one), serve it, and pass the CA's certificate with --ca-cert PATH";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// Whom an `https://` client trusts.
#[derive(Debug, Args)]
pub struct ClientTls {
    /// For https:// — a PEM file of CA certificates (one or several) to trust instead of the
    /// platform's roots, for a server with a private CA.
    #[arg(long, value_name = "PATH")]
    ca_cert: Option<PathBuf>,
}

/// The connector `call` and the proxy send through: `http://` as before, `https://` over
/// rustls, the whole connect (TCP and handshake) bounded by [`HANDSHAKE_TIMEOUT`].
#[derive(Clone, Debug)]
pub struct Connector {
    inner: HttpsConnector<HttpConnector>,
}

impl ClientTls {
    /// Trusting the CA certificates of `ca_cert`, or the platform's roots without it.
    pub fn trusting(ca_cert: Option<PathBuf>) -> Self {
        Self { ca_cert }
    }

    /// The connector for `url` (`http` or `https`; `flag` names the option in errors). The
    /// roots are loaded only for an `https` URL or when `--ca-cert` names a file.
    pub fn connector(&self, url: &Uri, flag: &str) -> anyhow::Result<Connector> {
        let roots = match (url.scheme_str(), &self.ca_cert) {
            (_, Some(path)) => ca_roots(path)?,
            (Some("https"), None) => platform_roots()?,
            (Some("http"), None) => RootCertStore::empty(),
            _ => bail!("{flag} must be http://… or https://…"),
        };
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .context("the TLS provider has no protocol version")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let inner = HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Connector { inner })
    }
}

/// Only the CAs in `path`.
fn ca_roots(path: &Path) -> anyhow::Result<RootCertStore> {
    let shown = path.display();
    let certs = read_certificates(path, "--ca-cert")?;
    let mut roots = RootCertStore::empty();
    for (n, cert) in certs.into_iter().enumerate() {
        roots.add(cert).map_err(|error| {
            anyhow::anyhow!(
                "--ca-cert {shown}: certificate {} is not a usable CA certificate ({error}): give the CA's certificate in PEM",
                n + 1
            )
        })?;
    }
    Ok(roots)
}

/// The platform's roots (`SSL_CERT_FILE` / `SSL_CERT_DIR` override them, as for OpenSSL).
fn platform_roots() -> anyhow::Result<RootCertStore> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map(|error| format!(" ({error})"))
            .unwrap_or_default();
        bail!(
            "no trusted root certificates found on this system{why}: pass --ca-cert PATH with the CA that signed the server's certificate"
        );
    }
    Ok(roots)
}

/// Every certificate of a PEM file; an error names the file and the option.
fn read_certificates(path: &Path, flag: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let shown = path.display();
    let pem =
        std::fs::read(path).with_context(|| format!("{flag} {shown}: cannot read the file"))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| anyhow::anyhow!("{flag} {shown}: not valid PEM ({error})"))?;
    if certs.is_empty() {
        bail!(
            "{flag} {shown}: no certificate in it: give PEM certificates (-----BEGIN CERTIFICATE-----)"
        );
    }
    Ok(certs)
}

/// The connect never finished its handshake in time.
#[derive(Debug)]
struct HandshakeTimeout;

impl fmt::Display for HandshakeTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the connection (TCP and TLS handshake) did not finish within {}s",
            HANDSHAKE_TIMEOUT.as_secs()
        )
    }
}

impl StdError for HandshakeTimeout {}

type BoxError = Box<dyn StdError + Send + Sync>;
type Connection = MaybeHttpsStream<TokioIo<TcpStream>>;

impl Service<Uri> for Connector {
    type Response = Connection;
    type Error = BoxError;
    // Boxed: hyper-util wants an `Unpin` connect future, and a timer is not.
    type Future = Pin<Box<dyn Future<Output = Result<Connection, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connect = self.inner.call(uri);
        Box::pin(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, connect).await {
                Ok(connected) => connected,
                Err(_) => Err(HandshakeTimeout.into()),
            }
        })
    }
}

/// An error on one line, with the advice of [`hint`] when TLS refused the connection.
pub fn described(error: &(dyn StdError + 'static)) -> String {
    let text = crate::mcp_http::describe(error);
    match hint(error) {
        Some(hint) => format!("{text}; {hint}"),
        None => text,
    }
}

/// What to do about an error that came from rustls (a certificate it refused, a failed
/// handshake), by what it refused: a server certificate that is a CA's gets
/// [`CA_AS_SERVER_HINT`], anything else [`CA_CERT_HINT`]. `None` for any other error (a
/// stalled handshake says so itself).
pub fn hint(error: &(dyn StdError + 'static)) -> Option<&'static str> {
    let refused = rustls_error(error)?;
    let ca_as_server = matches!(
        refused,
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other))
            // rustls passes webpki's own error on, which names itself.
            if other.to_string() == "CaUsedAsEndEntity"
    );
    Some(if ca_as_server {
        CA_AS_SERVER_HINT
    } else {
        CA_CERT_HINT
    })
}

/// The rustls error in `error`'s chain, if any.
fn rustls_error<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(refused) = e.downcast_ref::<rustls::Error>() {
            return Some(refused);
        }
        // An `io::Error` hides the error it wraps from `source()` (hyper-rustls wraps
        // tokio-rustls's, which wraps rustls's): look inside it.
        current = match e.downcast_ref::<io::Error>().and_then(io::Error::get_ref) {
            Some(inner) => Some(inner),
            None => e.source(),
        };
    }
    None
}

/// The proxy listener's certificate and key.
#[derive(Debug, Args)]
pub struct ListenerTls {
    /// Serve HTTPS to clients: the certificate chain in PEM, the server's certificate first
    /// (with --tls-key).
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert in PEM (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Ask each client for a certificate and verify it against the CA certificates of this PEM
    /// file (with --tls-cert): a client that presents one is the principal its certificate's
    /// subject names. A client without one authenticates otherwise, or gets 401.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// With --client-ca: the principal is the certificate's first subject alternative name of
    /// this kind instead of its subject (a certificate without one is refused, 401).
    #[arg(long, value_enum, value_name = "KIND", requires = "client_ca")]
    client_principal_san: Option<SanKind>,
}

/// A kind of subject alternative name that names a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SanKind {
    /// A DNS name.
    Dns,
    /// A URI (a SPIFFE ID, say).
    Uri,
    /// An e-mail address.
    Email,
}

/// What a client certificate, verified by `--client-ca`, names: its subject, and its subject
/// alternative names by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// RFC 4514 form: `CN=alice,O=Example`.
    pub subject: String,
    pub alternative_names: Vec<(SanKind, String)>,
}

impl ListenerTls {
    /// The listener's TLS: none without `--tls-cert`.
    pub fn listener(&self) -> anyhow::Result<Listener> {
        let (Some(cert_path), Some(key_path)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(Listener { acceptor: None });
        };
        let chain = read_certificates(cert_path, "--tls-cert")?;
        let key = read_key(key_path)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .context("the TLS provider has no protocol version")?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for ca in read_certificates(path, "--client-ca")? {
                    roots.add(ca).with_context(|| {
                        format!("--client-ca {}: not a CA certificate", path.display())
                    })?;
                }
                // A client without a certificate still connects: it may authenticate otherwise,
                // and gets an HTTP 401 (which a TLS alert could not say) if it does not.
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .allow_unauthenticated()
                        .build()
                        .with_context(|| format!("--client-ca {}", path.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|error| {
                anyhow::anyhow!(
                    "--tls-cert {} with --tls-key {}: {error}: give a certificate and the private key it was issued for",
                    cert_path.display(),
                    key_path.display()
                )
            })?;
        // The proxy serves HTTP/1.1 only (its delivery rule reads one connection's order).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Listener {
            acceptor: Some(TlsAcceptor::from(Arc::new(config))),
        })
    }

    /// How a client certificate names the principal: `None` when clients are not asked for
    /// one (no `--client-ca`); `Some(None)` its subject; `Some(Some(kind))` its first subject
    /// alternative name of that kind.
    pub fn client_principal(&self) -> Option<Option<SanKind>> {
        self.client_ca.as_ref().map(|_| self.client_principal_san)
    }
}

/// What the certificate a client presented on `stream` names, verified by `--client-ca`;
/// `None` for a plain connection or no certificate.
pub fn client_identity(stream: &ClientStream) -> Option<ClientIdentity> {
    use x509_parser::extensions::GeneralName;
    let Either::Right(tls) = stream else {
        return None;
    };
    let der = tls.get_ref().1.peer_certificates()?.first()?;
    let (_, certificate) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let alternative_names = match certificate.subject_alternative_name() {
        Ok(Some(names)) => names
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::DNSName(dns) => Some((SanKind::Dns, (*dns).to_owned())),
                GeneralName::URI(uri) => Some((SanKind::Uri, (*uri).to_owned())),
                GeneralName::RFC822Name(email) => Some((SanKind::Email, (*email).to_owned())),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    Some(ClientIdentity {
        subject: certificate.subject().to_string(),
        alternative_names,
    })
}

/// A private key; an error never shows the file's content.
fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let shown = path.display();
    let pem =
        std::fs::read(path).with_context(|| format!("--tls-key {shown}: cannot read the file"))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| {
        anyhow::anyhow!(
            "--tls-key {shown}: no private key in it: give the key in PEM (-----BEGIN PRIVATE KEY-----, RSA or EC)"
        )
    })
}

/// A client connection of the proxy: plain, or TLS once its handshake is done.
pub type ClientStream = Either<TcpStream, TlsStream<TcpStream>>;

/// How the proxy's listener speaks: plain HTTP, or HTTPS with its certificate.
#[derive(Clone)]
pub struct Listener {
    acceptor: Option<TlsAcceptor>,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("tls", &self.acceptor.is_some())
            .finish()
    }
}

impl Listener {
    /// `http` or `https`.
    pub fn scheme(&self) -> &'static str {
        if self.acceptor.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// An accepted connection, ready for HTTP: for TLS, after its handshake, bounded by
    /// [`HANDSHAKE_TIMEOUT`]. Call it on the connection's own task, never in the accept loop.
    pub async fn accept(&self, stream: TcpStream) -> io::Result<ClientStream> {
        let Some(acceptor) = &self.acceptor else {
            return Ok(Either::Left(stream));
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(accepted) => accepted.map(Either::Right),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client did not finish its TLS handshake within {}s",
                    HANDSHAKE_TIMEOUT.as_secs()
                ),
            )),
        }
    }
}
