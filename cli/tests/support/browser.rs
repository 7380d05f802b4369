//! A real headless browser for the review page's test: Debian's Chromium driven through its
//! chromedriver over WebDriver, on a free port of 127.0.0.1.

use std::{path::Path, time::Duration};

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// `None` (with the reason printed) when Chromium or its driver is not installed and `CI` is
/// not set; a panic, with how to install them, when they are missing on CI.
pub fn browser_or_skip() -> Option<()> {
    let missing: Vec<&str> = [CHROMIUM, CHROMEDRIVER]
        .into_iter()
        .filter(|path| !Path::new(path).exists())
        .collect();
    if missing.is_empty() {
        return Some(());
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} missing on CI: .ci/run installs them before the tests \
         (apt-get install -y chromium chromium-driver)",
        missing.join(" and ")
    );
    eprintln!(
        "skipped: {} not installed (apt-get install chromium chromium-driver)",
        missing.join(" and ")
    );
    None
}

/// A running chromedriver, killed when dropped.
pub struct Chromedriver {
    pub url: String,
    _child: tokio::process::Child,
}

impl Chromedriver {
    /// Starts chromedriver on a free port of 127.0.0.1 and waits until it answers.
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = tokio::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "chromedriver did not listen on {port} within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            url: format!("http://127.0.0.1:{port}"),
            _child: child,
        }
    }

    /// A new headless Chromium session (root needs `--no-sandbox`; a container's small
    /// `/dev/shm`, `--disable-dev-shm-usage`).
    pub async fn headless(&self) -> Client {
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            serde_json::json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1400,1100",
                ],
            }),
        );
        ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .expect("a Chromium session")
    }
}
