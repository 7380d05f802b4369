//! What tests of the listeners share: a free port, a plain GET, and a real HTTP receiver that
//! keeps every body POSTed to it (a hook's, an OTLP exporter's).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::{hyper_client, send};

/// A free port on 127.0.0.1 (bound, then let go).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET url` on a connection of its own: the status and the body as text.
pub async fn get_text(url: &str) -> (StatusCode, String) {
    let mut client = hyper_client();
    let request = Request::get(url).body(Full::new(Bytes::new())).unwrap();
    let response = send(&mut client, request).await.expect("an answer");
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The bodies a [`post_receiver`] was sent, with their paths, in order.
pub type Posted = Arc<Mutex<Vec<(String, Bytes)>>>;

/// A real HTTP/1 server on 127.0.0.1 that answers every request 200 and keeps each body with
/// its path; its base URL (`http://127.0.0.1:PORT`).
pub async fn post_receiver() -> (String, Posted) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let posted = Posted::default();
    let kept = posted.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let kept = kept.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let kept = kept.clone();
                        async move {
                            let path = request.uri().path().to_owned();
                            let body = request.into_body().collect().await?.to_bytes();
                            kept.lock().unwrap().push((path, body));
                            Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::new())))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, posted)
}
