//! The connection: a russh client whose only trusted host key is the one the caller pinned.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use russh::{
    ChannelMsg,
    client::{self, Handle},
    keys::{self, HashAlg, PrivateKey, PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate},
};

use super::{MarkedCommand, SshError};
use crate::fingerprint::Channel;

/// The host key the caller trusts for a host. Nothing else is accepted: a host that presents
/// another key is a [`SshError::HostKeyMismatch`], before anything is sent.
#[derive(Clone)]
pub enum HostKeyPin {
    /// A SHA256 fingerprint as OpenSSH prints it (`ssh-keygen -lf key.pub`): `SHA256:` and the
    /// unpadded base64 of the digest.
    Fingerprint(String),
    /// The public key itself.
    PublicKey(PublicKey),
    /// An OpenSSH `known_hosts` file; the host must be listed there under the name and port
    /// this connection uses (`[host]:port` for a port other than 22).
    KnownHosts(PathBuf),
}

impl HostKeyPin {
    /// Pin a fingerprint (`SHA256:…`, as `ssh-keygen -lf` prints it).
    pub fn fingerprint(fingerprint: impl Into<String>) -> Self {
        Self::Fingerprint(fingerprint.into())
    }

    /// Pin a public key given in OpenSSH form (`ssh-ed25519 AAAA… comment`, a `.pub` file's line).
    pub fn openssh_public_key(line: &str) -> Result<Self, SshError> {
        PublicKey::from_openssh(line.trim())
            .map(Self::PublicKey)
            .map_err(|e| SshError::Key {
                what: "the pinned host key".to_owned(),
                message: e.to_string(),
            })
    }

    /// Pin whatever a `known_hosts` file lists for the host.
    pub fn known_hosts(path: impl Into<PathBuf>) -> Self {
        Self::KnownHosts(path.into())
    }

    fn describe(&self) -> String {
        match self {
            Self::Fingerprint(f) => f.clone(),
            Self::PublicKey(k) => k.fingerprint(HashAlg::Sha256).to_string(),
            Self::KnownHosts(p) => format!("the key listed in {}", p.display()),
        }
    }
}

impl fmt::Debug for HostKeyPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HostKeyPin").field(&self.describe()).finish()
    }
}

/// Where to connect, as whom, and which host key to trust.
#[derive(Clone)]
pub struct SshConfig {
    host: String,
    port: u16,
    account: String,
    key: Option<Arc<PrivateKey>>,
    pin: HostKeyPin,
    connect_timeout: Duration,
    keepalive: Duration,
}

impl fmt::Debug for SshConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("account", &self.account)
            .field("key", &self.key.as_ref().map(|_| "<private key>"))
            .field("pin", &self.pin)
            .field("connect_timeout", &self.connect_timeout)
            .field("keepalive", &self.keepalive)
            .finish()
    }
}

impl SshConfig {
    /// Connect to `host:port` as `account`, trusting only the host key `pin`.
    pub fn new(
        host: impl Into<String>,
        port: u16,
        account: impl Into<String>,
        pin: HostKeyPin,
    ) -> Self {
        Self {
            host: host.into(),
            port,
            account: account.into(),
            key: None,
            pin,
            connect_timeout: Duration::from_secs(15),
            keepalive: Duration::from_secs(15),
        }
    }

    /// How long connecting, the key exchange and authentication may take together (15 s by
    /// default). Nothing has been sent when it passes.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The keepalive interval (15 s by default): after three unanswered keepalives the
    /// connection counts as broken, so a host that vanished without a reset ends a
    /// [`run_marked`](super::run_marked) with [`SshError::OutcomeUnknown`] instead of a wait
    /// for ever. A command may run longer than this; only the connection's silence counts.
    pub fn keepalive(mut self, interval: Duration) -> Self {
        self.keepalive = interval;
        self
    }

    /// Authenticate with this private key.
    pub fn private_key(mut self, key: PrivateKey) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// Authenticate with the private key in this OpenSSH file (unencrypted).
    pub fn private_key_file(self, path: impl AsRef<Path>) -> Result<Self, SshError> {
        let path = path.as_ref();
        let key = keys::load_secret_key(path, None).map_err(|e| SshError::Key {
            what: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(self.private_key(key))
    }

    /// The account commands run as.
    pub fn account(&self) -> &str {
        &self.account
    }

    /// Open the connection: check the host key against the pin, then authenticate.
    pub async fn connect(&self) -> Result<SshSession, SshError> {
        tokio::time::timeout(self.connect_timeout, self.connect_now())
            .await
            .unwrap_or_else(|_| Err(self.connect_error("timed out")))
    }

    async fn connect_now(&self) -> Result<SshSession, SshError> {
        let Some(key) = self.key.clone() else {
            return Err(SshError::Key {
                what: "the client key".to_owned(),
                message: "no private key configured".to_owned(),
            });
        };
        let seen = Arc::new(Mutex::new(None));
        let handler = PinnedHostKey {
            pin: self.pin.clone(),
            host: self.host.clone(),
            port: self.port,
            seen: Arc::clone(&seen),
        };
        let config = Arc::new(client::Config {
            keepalive_interval: Some(self.keepalive),
            keepalive_max: 3,
            ..client::Config::default()
        });
        let connected = client::connect(config, (self.host.as_str(), self.port), handler).await;
        let check = seen.lock().map(|mut s| s.take()).unwrap_or(None);
        let (mut handle, host_fingerprint) = match (connected, check) {
            (Ok(handle), Some(KeyCheck::Accepted(presented))) => (handle, presented),
            (_, Some(KeyCheck::Rejected { presented, reason })) => {
                return Err(SshError::HostKeyMismatch {
                    host: format!("{}:{}", self.host, self.port),
                    expected: self.pin.describe(),
                    presented,
                    reason,
                });
            }
            (Ok(_), None) => {
                return Err(self.connect_error("the host key was never checked"));
            }
            (Err(e), _) => return Err(self.connect_error(e)),
        };
        let hash = handle
            .best_supported_rsa_hash()
            .await
            .map_err(|e| self.connect_error(e))?
            .flatten();
        let auth = handle
            .authenticate_publickey(self.account.clone(), PrivateKeyWithHashAlg::new(key, hash))
            .await
            .map_err(|e| self.connect_error(e))?;
        if !auth.success() {
            return Err(SshError::AuthRejected {
                account: self.account.clone(),
            });
        }
        Ok(SshSession {
            handle,
            host_fingerprint,
            account: self.account.clone(),
        })
    }

    fn connect_error(&self, e: impl fmt::Display) -> SshError {
        SshError::Connect {
            host: format!("{}:{}", self.host, self.port),
            message: e.to_string(),
        }
    }
}

#[derive(Debug, Clone)]
enum KeyCheck {
    Accepted(String),
    Rejected { presented: String, reason: String },
}

/// The russh handler: accepts the pinned host key and nothing else.
struct PinnedHostKey {
    pin: HostKeyPin,
    host: String,
    port: u16,
    seen: Arc<Mutex<Option<KeyCheck>>>,
}

impl PinnedHostKey {
    fn check(&self, key: &PublicKey) -> Result<(), String> {
        match &self.pin {
            HostKeyPin::Fingerprint(expected) => {
                let presented = key.fingerprint(HashAlg::Sha256).to_string();
                if presented == expected.trim() {
                    Ok(())
                } else {
                    Err("the fingerprint differs from the pinned one".to_owned())
                }
            }
            HostKeyPin::PublicKey(pinned) => {
                if pinned.key_data() == key.key_data() {
                    Ok(())
                } else {
                    Err("the key differs from the pinned one".to_owned())
                }
            }
            HostKeyPin::KnownHosts(path) => {
                match keys::check_known_hosts_path(&self.host, self.port, key, path) {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(format!(
                        "{} lists no key of this type for {}:{}",
                        path.display(),
                        self.host,
                        self.port
                    )),
                    Err(e) => Err(format!("{}: {e}", path.display())),
                }
            }
        }
    }
}

impl client::Handler for PinnedHostKey {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let verdict = match server {
            PublicKeyOrCertificate::PublicKey { key, .. } => {
                let presented = key.fingerprint(HashAlg::Sha256).to_string();
                match self.check(key) {
                    Ok(()) => KeyCheck::Accepted(presented),
                    Err(reason) => KeyCheck::Rejected { presented, reason },
                }
            }
            PublicKeyOrCertificate::Certificate(cert) => KeyCheck::Rejected {
                presented: cert.public_key().fingerprint(HashAlg::Sha256).to_string(),
                reason: "host certificates are not accepted; pin the host key".to_owned(),
            },
        };
        let accepted = matches!(verdict, KeyCheck::Accepted(_));
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Some(verdict);
        }
        Ok(accepted)
    }
}

/// An authenticated SSH connection to one pinned host.
pub struct SshSession {
    handle: Handle<PinnedHostKey>,
    host_fingerprint: String,
    account: String,
}

impl fmt::Debug for SshSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshSession")
            .field("host_fingerprint", &self.host_fingerprint)
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

/// The most a remote answer may hold (stdout and stderr together) before the crate stops
/// reading it: the wrapper's answers are bounded by [`MAX_OUTPUT_LIMIT`](super::MAX_OUTPUT_LIMIT)
/// per stream, and a host that sends more is not speaking the wrapper's protocol.
const MAX_ANSWER_BYTES: usize = 80 << 20;

/// What one remote command printed, and how it ended.
#[derive(Debug, Default)]
pub(crate) struct Exec {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) exit_status: Option<u32>,
    /// The answer passed [`MAX_ANSWER_BYTES`] and was cut there.
    pub(crate) overflowed: bool,
}

impl SshSession {
    /// The host's identity: the SHA256 fingerprint of the host key it presented (and the pin
    /// accepted), as OpenSSH prints it. Not the name typed, which DNS may move.
    pub fn host_fingerprint(&self) -> &str {
        &self.host_fingerprint
    }

    /// The account commands run as.
    pub fn account(&self) -> &str {
        &self.account
    }

    /// The action record's channel for `command` on this connection: the host key fingerprint,
    /// the account, the command line and the working directory.
    pub fn channel(&self, command: &MarkedCommand) -> Channel {
        Channel::Ssh {
            host_identity: self.host_fingerprint.clone(),
            account: self.account.clone(),
            command: command.command().to_owned(),
            working_directory: command.working_directory().map(str::to_owned),
        }
    }

    /// Close the connection.
    pub async fn disconnect(self) {
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
    }

    /// Open a session channel; `Err` here means nothing was sent.
    pub(crate) async fn open(&self) -> Result<russh::Channel<client::Msg>, russh::Error> {
        self.handle.channel_open_session().await
    }

    /// Run `line` on an open channel and collect everything until the channel closes. `Err`
    /// (or `Ok` without an exit status) once `exec` was sent means the end was not seen.
    pub(crate) async fn exec(
        channel: &mut russh::Channel<client::Msg>,
        line: String,
        exec: &mut Exec,
    ) -> Result<(), russh::Error> {
        channel.exec(true, line).await?;
        while let Some(msg) = channel.wait().await {
            if exec.stdout.len() + exec.stderr.len() > MAX_ANSWER_BYTES {
                exec.overflowed = true;
                break;
            }
            match msg {
                ChannelMsg::Data { data } => exec.stdout.extend_from_slice(&data),
                ChannelMsg::ExtendedData { data, ext: 1 } => exec.stderr.extend_from_slice(&data),
                ChannelMsg::ExitStatus { exit_status } => exec.exit_status = Some(exit_status),
                _ => {}
            }
        }
        Ok(())
    }
}
