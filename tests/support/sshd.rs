//! A real OpenSSH server on 127.0.0.1 for the `ssh` feature's tests: `sshd -D -e` on a free
//! port with a host key and a user key made by `ssh-keygen` in a temp dir, and a TCP forwarder
//! in front of it that a test can mute (the host's answers stop arriving) or cut.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use mcp_replay_guard::{
    ExecutionId,
    integrations::ssh::{HostKeyPin, SshConfig},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

const SSHD: &str = "/usr/sbin/sshd";

/// `None` (with the reason printed) when sshd is not installed and `CI` is not set; a panic
/// when it is missing on CI.
pub fn sshd_or_skip() -> Option<()> {
    if Path::new(SSHD).exists() {
        return Some(());
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{SSHD} is missing on CI: .ci/run installs openssh-server before the tests"
    );
    eprintln!("skipped: {SSHD} is not installed (apt-get install openssh-server)");
    None
}

/// A running sshd and the keys to reach it.
pub struct Sshd {
    pub dir: PathBuf,
    pub port: u16,
    pub host_fingerprint: String,
    pub host_public_key: String,
    child: Child,
}

fn keygen(path: &Path) {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "mrg-test", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen");
    assert!(status.success());
}

/// `SHA256:…` of a public key file, as `ssh-keygen -lf` prints it.
pub fn fingerprint_of(public_key: &Path) -> String {
    let out = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(public_key)
        .output()
        .unwrap();
    let line = String::from_utf8(out.stdout).unwrap();
    line.split_whitespace().nth(1).unwrap().to_owned()
}

pub fn account() -> String {
    std::env::var("USER").unwrap_or_else(|_| "root".to_owned())
}

/// The account the markers tests use as "another account on the host".
pub const SECOND_ACCOUNT: &str = "mrg-second";

/// The uid and gid of an account, from `id`.
pub fn ids_of(name: &str) -> Option<(u32, u32)> {
    let id = |flag: &str| {
        let out = Command::new("id").args([flag, name]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    Some((id("-u")?, id("-g")?))
}

/// The uid and gid of [`SECOND_ACCOUNT`], made with `useradd` when missing (the tests run as
/// root). `None` (with the reason printed) when it cannot be made and `CI` is not set; a panic
/// under CI.
pub fn second_account_or_skip() -> Option<(u32, u32)> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(ids) = ids_of(SECOND_ACCOUNT) {
        return Some(ids);
    }
    let made = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
        ])
        .arg(SECOND_ACCOUNT)
        .output();
    if let Some(ids) = ids_of(SECOND_ACCOUNT) {
        return Some(ids);
    }
    let why = match made {
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        Err(e) => e.to_string(),
    };
    assert!(
        std::env::var_os("CI").is_none(),
        "cannot create the account {SECOND_ACCOUNT} on CI (useradd: {why}): the marker tests \
         need a second account; run them as root"
    );
    eprintln!("skipped: cannot create the account {SECOND_ACCOUNT} (useradd: {why})");
    None
}

impl Sshd {
    pub async fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "mrg-sshd-{name}-{}-{}",
            std::process::id(),
            ExecutionId::new().ulid()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all("/run/sshd").ok(); // privilege separation directory
        keygen(&dir.join("host_key"));
        keygen(&dir.join("user_key"));
        std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\n\
             AuthorizedKeysFile {d}/authorized_keys\nPidFile {d}/sshd.pid\nStrictModes no\n\
             UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             PubkeyAuthentication yes\nPermitRootLogin yes\nLogLevel VERBOSE\n",
            d = dir.display()
        );
        std::fs::write(dir.join("sshd_config"), config).unwrap();
        let log = std::fs::File::create(dir.join("sshd.log")).unwrap();
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(dir.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sshd");
        let sshd = Self {
            host_fingerprint: fingerprint_of(&dir.join("host_key.pub")),
            host_public_key: std::fs::read_to_string(dir.join("host_key.pub")).unwrap(),
            dir,
            port,
            child,
        };
        for _ in 0..100 {
            if TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return sshd;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("sshd did not listen on {port}: {}", sshd.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }

    /// A config pinned to this server's host key fingerprint.
    pub fn config(&self) -> SshConfig {
        self.config_on(self.port, HostKeyPin::fingerprint(&self.host_fingerprint))
    }

    pub fn config_on(&self, port: u16, pin: HostKeyPin) -> SshConfig {
        SshConfig::new("127.0.0.1", port, account(), pin)
            .private_key_file(self.dir.join("user_key"))
            .unwrap()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Kept for a look when the test failed.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A TCP forwarder to sshd for one connection: `mute` drops everything the host sends from
/// then on (the command runs, its answer is lost); `cut` closes both sockets.
pub struct Forwarder {
    pub port: u16,
    muted: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Forwarder {
    pub async fn start(to: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let muted = Arc::new(AtomicBool::new(false));
        let mute = Arc::clone(&muted);
        let task = tokio::spawn(async move {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let Ok(server) = TcpStream::connect(("127.0.0.1", to)).await else {
                return;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let up = async move {
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n @ 1..) = cr.read(&mut buf).await {
                    if sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            };
            let down = async move {
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n @ 1..) = sr.read(&mut buf).await {
                    if !mute.load(Ordering::SeqCst) && cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            };
            tokio::select! { _ = up => {}, _ = down => {} }
        });
        Self { port, muted, task }
    }

    pub fn mute(&self) {
        self.muted.store(true, Ordering::SeqCst);
    }

    /// Close both sockets now (the connection is cut under the client).
    pub fn cut(&self) {
        self.task.abort();
    }
}
