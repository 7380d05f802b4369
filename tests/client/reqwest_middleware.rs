//! The reqwest-middleware integration over real HTTP on 127.0.0.1: a server written here counts
//! every request it reads and can hang up on it without answering, so each test knows exactly
//! how many requests reached it.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
};

use http::Extensions;
use mcp_replay_guard::{
    ExecutionId, IdempotencyKey, IdempotencyKeyFormat,
    integrations::reqwest::{
        AmbiguousOutcome, IdempotencyKeyMiddleware, ReplaySafeRetryMiddleware, current_execution,
        is_ambiguous, with_execution,
    },
    replay_policy::Backoff,
};
use reqwest::{Request, Response, StatusCode};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

const ATTEMPTS: u32 = 3;

/// What the server does with a request once it has read all of it.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Answer with this status.
    Status(u16),
    /// Reset the connection without answering: the request arrived, the caller cannot know.
    HangUp,
}

/// One request as the server read it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    idempotency_key: Option<String>,
    body: String,
}

struct Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    async fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, mode, log.clone()));
            }
        });
        Self { addr, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Reads one whole request (head and `Content-Length` body), records it, then acts per `mode`.
async fn serve(mut stream: TcpStream, mode: Mode, log: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0; 4096];
        let n = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let header = |name: &str| {
        head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let length: usize = header("content-length").map_or(0, |v| v.parse().unwrap());
    while buf.len() < head_end + length {
        let mut chunk = [0; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    log.lock().unwrap().push(Seen {
        method: head.split(' ').next().unwrap_or_default().to_owned(),
        idempotency_key: header("idempotency-key"),
        body: String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned(),
    });
    match mode {
        Mode::Status(status) => {
            let response =
                format!("HTTP/1.1 {status} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Mode::HangUp => {
            let _ = stream.set_zero_linger();
            drop(stream);
        }
    }
}

/// Counts the attempts that leave the retry middleware (placed below it).
#[derive(Clone, Default)]
struct CountAttempts(Arc<AtomicU32>);

#[async_trait::async_trait]
impl Middleware for CountAttempts {
    async fn handle(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        self.0.fetch_add(1, Ordering::SeqCst);
        next.run(request, extensions).await
    }
}

fn client(counter: &CountAttempts) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::builder().no_proxy().build().unwrap())
        .with(IdempotencyKeyMiddleware::new())
        .with(
            ReplaySafeRetryMiddleware::new()
                .max_attempts(ATTEMPTS)
                .backoff(Backoff::none()),
        )
        .with(counter.clone())
        .build()
}

#[tokio::test]
async fn a_post_without_a_key_is_sent_once_and_its_error_is_ambiguous() {
    let server = Server::start(Mode::HangUp).await;
    let counter = CountAttempts::default();
    let error = client(&counter)
        .post(server.url("/payments"))
        .body(r#"{"amount":500}"#)
        .send()
        .await
        .unwrap_err();
    assert_eq!(server.seen().len(), 1);
    assert_eq!(counter.0.load(Ordering::SeqCst), 1);
    assert!(is_ambiguous(&error), "{error:?}");
    let ambiguous = AmbiguousOutcome::find(&error).unwrap();
    assert_eq!(ambiguous.method(), "POST");
    assert_eq!(ambiguous.url().path(), "/payments");
    assert!(ambiguous.get_ref().is_request() || ambiguous.get_ref().is_body());
    assert!(error.to_string().contains("outcome unknown"), "{error}");
}

#[tokio::test]
async fn a_post_with_a_key_is_resent_under_that_key() {
    let server = Server::start(Mode::HangUp).await;
    let counter = CountAttempts::default();
    let error = client(&counter)
        .post(server.url("/payments"))
        .header("idempotency-key", "order-42")
        .body(r#"{"amount":500}"#)
        .send()
        .await
        .unwrap_err();
    let seen = server.seen();
    assert_eq!(seen.len(), ATTEMPTS as usize);
    assert!(
        seen.iter()
            .all(|s| s.idempotency_key.as_deref() == Some("order-42")
                && s.body == r#"{"amount":500}"#),
        "{seen:?}"
    );
    // Re-sendable, so not ambiguous: the caller may send it again under the same key.
    assert!(!is_ambiguous(&error), "{error:?}");
}

#[tokio::test]
async fn a_post_inside_an_execution_is_resent_under_the_execution_key() {
    let server = Server::start(Mode::HangUp).await;
    let counter = CountAttempts::default();
    let client = client(&counter);
    let execution = ExecutionId::new();
    let result = with_execution(execution, async {
        client.post(server.url("/payments")).body("{}").send().await
    })
    .await;
    assert!(!is_ambiguous(&result.unwrap_err()));
    let seen = server.seen();
    assert_eq!(seen.len(), ATTEMPTS as usize);
    let key = execution.to_string();
    assert!(
        seen.iter()
            .all(|s| s.idempotency_key.as_deref() == Some(key.as_str())),
        "{seen:?}"
    );
}

#[tokio::test]
async fn idempotent_methods_are_resent() {
    let server = Server::start(Mode::HangUp).await;
    let counter = CountAttempts::default();
    let client = client(&counter);
    for method in [
        reqwest::Method::GET,
        reqwest::Method::PUT,
        reqwest::Method::DELETE,
    ] {
        let error = client
            .request(method.clone(), server.url("/branches"))
            .send()
            .await
            .unwrap_err();
        assert!(!is_ambiguous(&error), "{method}: {error:?}");
    }
    let methods: Vec<_> = server.seen().into_iter().map(|s| s.method).collect();
    assert_eq!(
        methods,
        [
            "GET", "GET", "GET", "PUT", "PUT", "PUT", "DELETE", "DELETE", "DELETE"
        ]
    );
}

#[tokio::test]
async fn a_refused_connection_is_resent_as_not_sent() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().port()
    };
    let counter = CountAttempts::default();
    let error = client(&counter)
        .post(format!("http://127.0.0.1:{port}/payments"))
        .body(r#"{"amount":500}"#)
        .send()
        .await
        .unwrap_err();
    assert_eq!(counter.0.load(Ordering::SeqCst), ATTEMPTS);
    assert!(error.is_connect(), "{error:?}");
    assert!(!is_ambiguous(&error), "nothing was sent: {error:?}");
}

#[tokio::test]
async fn error_statuses_are_resent_under_the_same_conditions() {
    let counter = CountAttempts::default();
    let client = client(&counter);
    // (status, method, key, attempts)
    let rows: &[(u16, &str, bool, usize)] = &[
        (500, "POST", false, 1),
        (503, "POST", true, ATTEMPTS as usize),
        (429, "POST", false, 1),
        (429, "POST", true, ATTEMPTS as usize),
        (502, "GET", false, ATTEMPTS as usize),
        (404, "GET", false, 1),
        (200, "POST", true, 1),
    ];
    for &(status, method, key, attempts) in rows {
        let server = Server::start(Mode::Status(status)).await;
        let mut request = client.request(method.parse().unwrap(), server.url("/x"));
        if key {
            request = request.header("idempotency-key", "k-1");
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::from_u16(status).unwrap());
        assert_eq!(server.seen().len(), attempts, "{status} {method} key={key}");
    }
}

#[tokio::test]
async fn a_body_that_cannot_be_cloned_is_never_resent() {
    let server = Server::start(Mode::HangUp).await;
    let counter = CountAttempts::default();
    let error = client(&counter)
        .put(server.url("/branches/main"))
        .body(reqwest::Body::wrap(String::from("protected")))
        .send()
        .await
        .unwrap_err();
    assert_eq!(server.seen().len(), 1);
    // PUT is idempotent: the caller may send it again itself.
    assert!(!is_ambiguous(&error));
}

/// A client with only the key middleware.
fn keyed_client(format: IdempotencyKeyFormat) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::builder().no_proxy().build().unwrap())
        .with(IdempotencyKeyMiddleware::new().idempotency_key_format(format))
        .build()
}

#[tokio::test]
async fn the_key_comes_from_extensions_or_the_task_local_and_never_replaces_one() {
    let server = Server::start(Mode::Status(200)).await;
    let client = keyed_client(IdempotencyKeyFormat::Raw);
    let url = server.url("/payments");
    let execution = ExecutionId::new();
    let other = ExecutionId::new();
    assert!(current_execution().is_none());

    // No execution anywhere: no key.
    client.post(&url).send().await.unwrap();
    // From an `IdempotencyKey` extension.
    client
        .post(&url)
        .with_extension(IdempotencyKey::new("refund-7").unwrap())
        .send()
        .await
        .unwrap();
    // From an `ExecutionId` extension.
    client
        .post(&url)
        .with_extension(execution)
        .send()
        .await
        .unwrap();
    with_execution(other, async {
        assert_eq!(current_execution(), Some(other.into()));
        // From the task-local.
        client.post(&url).send().await.unwrap();
        // An extension wins over the task-local.
        client
            .post(&url)
            .with_extension(execution)
            .send()
            .await
            .unwrap();
        // A key already on the request wins over everything.
        client
            .post(&url)
            .header("idempotency-key", "caller-set")
            .with_extension(execution)
            .send()
            .await
            .unwrap();
        // A safe method changes nothing and gets no key.
        client.get(&url).send().await.unwrap();
    })
    .await;

    let keys: Vec<_> = server
        .seen()
        .into_iter()
        .map(|s| s.idempotency_key)
        .collect();
    let execution = execution.to_string();
    let other = other.to_string();
    assert_eq!(
        keys,
        [
            None,
            Some("refund-7"),
            Some(execution.as_str()),
            Some(other.as_str()),
            Some(execution.as_str()),
            Some("caller-set"),
            None,
        ]
        .map(|k| k.map(str::to_owned))
    );
}

#[tokio::test]
async fn the_key_can_be_spelled_as_a_structured_field_string() {
    let server = Server::start(Mode::Status(200)).await;
    let client = keyed_client(IdempotencyKeyFormat::StructuredField);
    let execution = ExecutionId::new();
    with_execution(execution, client.post(server.url("/payments")).send())
        .await
        .unwrap();
    assert_eq!(
        server.seen()[0].idempotency_key,
        Some(format!("\"{execution}\""))
    );
}
