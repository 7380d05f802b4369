//! A TCP relay between a ledger and PostgreSQL that a test cuts at a chosen moment: a
//! connection killed right before a COMMIT reaches the server (the transaction rolls back), or
//! right after the server answered it (committed, the answer lost).

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tokio_util::sync::CancellationToken;

/// A simple-protocol `Query` message holding `COMMIT` (what the client sends).
const COMMIT_QUERY: &[u8] = b"Q\x00\x00\x00\x0bCOMMIT\x00";

/// A `CommandComplete` message with the tag `COMMIT` (what the server answers).
const COMMIT_DONE: &[u8] = b"C\x00\x00\x00\x0bCOMMIT\x00";

/// Where the next cut falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The connection dies as the client's COMMIT would leave for the server: nothing of it
    /// is forwarded, and the server rolls the transaction back.
    BeforeCommit,
    /// The connection dies once the server's answer to a COMMIT arrived, before it is
    /// forwarded: the transaction is committed and the client never learns it.
    CommitAnswerLost,
}

#[derive(Debug)]
struct Armed {
    cut: Cut,
    /// Matching COMMITs let through before the cut.
    skip: usize,
    /// After the cut, the server is out of reach until [`PgRelay::restore`].
    outage: bool,
}

/// A relay on 127.0.0.1 in front of PostgreSQL.
pub struct PgRelay {
    /// The relay's port.
    pub port: u16,
    armed: Arc<Mutex<Option<Armed>>>,
    fired: Arc<AtomicUsize>,
    down: Arc<AtomicBool>,
    killed: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl PgRelay {
    /// A relay to the server of `url` (`postgres://user@host:port/db`).
    pub async fn start(url: &str) -> Self {
        let upstream = authority_of(url);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed: Arc<Mutex<Option<Armed>>> = Arc::default();
        let fired = Arc::new(AtomicUsize::new(0));
        let down = Arc::new(AtomicBool::new(false));
        let killed = CancellationToken::new();
        let cuts = Cuts {
            armed: armed.clone(),
            fired: fired.clone(),
            down: down.clone(),
            killed: killed.clone(),
        };
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                // Out of reach: the connection is closed at once.
                if cuts.down.load(Ordering::SeqCst) || cuts.killed.is_cancelled() {
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, cuts.clone()));
            }
        });
        Self {
            port,
            armed,
            fired,
            down,
            killed,
            task,
        }
    }

    /// `url` with its host and port replaced by the relay's.
    pub fn url(&self, url: &str) -> String {
        url.replacen(&authority_of(url), &format!("127.0.0.1:{}", self.port), 1)
    }

    /// Cuts the connection that carries the `skip + 1`-th COMMIT from now, at `cut`.
    pub fn arm(&self, cut: Cut, skip: usize) {
        self.set(Armed {
            cut,
            skip,
            outage: false,
        });
    }

    /// As [`arm`](Self::arm), and from the cut on the server is out of reach (every
    /// connection closed as it opens) until [`restore`](Self::restore).
    pub fn arm_with_outage(&self, cut: Cut, skip: usize) {
        self.set(Armed {
            cut,
            skip,
            outage: true,
        });
    }

    /// The process behind the relay dies: every connection through it ends now, mid-message
    /// if one is under way, and no new one opens, ever ([`restore`](Self::restore) does not
    /// bring it back). What the process had not sent never reaches the server, and nothing it
    /// holds (an owner's lease among them) is released.
    pub fn kill(&self) {
        self.killed.cancel();
    }

    /// Ends an outage.
    pub fn restore(&self) {
        self.down.store(false, Ordering::SeqCst);
    }

    fn set(&self, armed: Armed) {
        *self.armed.lock().unwrap_or_else(PoisonError::into_inner) = Some(armed);
    }

    /// How many connections were cut.
    pub fn fired(&self) -> usize {
        self.fired.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until `n` connections were cut; returns how many were.
    pub async fn wait_fired(&self, n: usize, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.fired() < n && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.fired()
    }
}

impl Drop for PgRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `host:port` of a `postgres://` URL.
fn authority_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    }
}

/// Whether the bytes seen so far in one direction (`tail`, then `chunk`) hold `pattern`; keeps
/// the end of `chunk` in `tail` for a message cut between two reads.
fn holds(tail: &mut Vec<u8>, chunk: &[u8], pattern: &[u8]) -> bool {
    tail.extend_from_slice(chunk);
    let found = tail.windows(pattern.len()).any(|w| w == pattern);
    let keep = tail.len().saturating_sub(pattern.len() - 1);
    tail.drain(..keep);
    found
}

/// What the connections of a relay share.
#[derive(Clone)]
struct Cuts {
    armed: Arc<Mutex<Option<Armed>>>,
    fired: Arc<AtomicUsize>,
    down: Arc<AtomicBool>,
    killed: CancellationToken,
}

impl Cuts {
    /// Whether the armed cut falls on this COMMIT of direction `cut`: consumes it (and
    /// counts it, and starts its outage) when it does.
    fn falls(&self, cut: Cut) -> bool {
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        match armed.as_mut() {
            Some(a) if a.cut == cut && a.skip > 0 => {
                a.skip -= 1;
                false
            }
            Some(a) if a.cut == cut => {
                if a.outage {
                    self.down.store(true, Ordering::SeqCst);
                }
                *armed = None;
                self.fired.fetch_add(1, Ordering::SeqCst);
                true
            }
            _ => false,
        }
    }
}

async fn relay(client: TcpStream, server: TcpStream, cuts: Cuts) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let (mut up, mut down) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let (mut up_tail, mut down_tail) = (Vec::new(), Vec::new());
    loop {
        tokio::select! {
            () = cuts.killed.cancelled() => break,
            read = from_client.read(&mut up) => {
                let Ok(n @ 1..) = read else { break };
                if holds(&mut up_tail, &up[..n], COMMIT_QUERY) && cuts.falls(Cut::BeforeCommit) {
                    break;
                }
                if to_server.write_all(&up[..n]).await.is_err() {
                    break;
                }
            }
            read = from_server.read(&mut down) => {
                let Ok(n @ 1..) = read else { break };
                if holds(&mut down_tail, &down[..n], COMMIT_DONE)
                    && cuts.falls(Cut::CommitAnswerLost)
                {
                    break;
                }
                if to_client.write_all(&down[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    // Both directions close here: the client sees its connection end, the server rolls back
    // whatever was not committed.
}
