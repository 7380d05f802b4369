//! Which `Host` and `Origin` the proxy serves: its defence against DNS rebinding, which MCP's
//! transport asks of every server. The proxy is the server its clients talk to (it sends the
//! upstream the upstream's own authority), so it checks them itself, before anything of the
//! request is read, sent or recorded.
//!
//! - `Host`: when the proxy listens on a loopback address, only `localhost`, `127.0.0.1` and
//!   `[::1]` with the listening port, unless `--allowed-host` names others; on any other
//!   address, the `--allowed-host`s when given, else any.
//! - `Origin` (sent by browsers): none is fine; otherwise it must be an `--allowed-origin`, or,
//!   without that flag, one of the loopback origins of the listening port when the proxy
//!   listens on loopback. A web page elsewhere never acts through the proxy.
//!
//! The review page (`review`) checks every request's `Host` by the same rule, with the same
//! flags, and its form's `Origin` when the browser does not say where the form came from.

use std::net::SocketAddr;

use http::{HeaderMap, Uri, header};

/// The hosts and origins the proxy serves.
#[derive(Debug, Clone)]
pub(crate) struct Origins {
    /// `None`: any host.
    hosts: Option<Vec<String>>,
    origins: Vec<String>,
}

/// Why a request was refused: what to say (the value is the client's own, bounded).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Foreign {
    #[error(
        "the Host {0:?} is not one this proxy serves (give it with --allowed-host); nothing was sent"
    )]
    Host(String),
    #[error(
        "the Origin {0:?} is not one this proxy serves (give it with --allowed-origin); nothing was sent"
    )]
    Origin(String),
}

const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

impl Origins {
    /// For a proxy listening on `local` (`scheme` `http` or `https`), with the flags' hosts
    /// and origins.
    pub(crate) fn new(
        local: SocketAddr,
        scheme: &str,
        hosts: &[String],
        origins: &[String],
    ) -> Self {
        let loopback = local.ip().is_loopback();
        let port = local.port();
        let hosts = if !hosts.is_empty() {
            Some(
                hosts
                    .iter()
                    .map(|host| host.trim().to_ascii_lowercase())
                    .collect(),
            )
        } else if loopback {
            Some(
                LOOPBACK_NAMES
                    .iter()
                    .map(|name| format!("{name}:{port}"))
                    .collect(),
            )
        } else {
            None
        };
        let origins = if !origins.is_empty() {
            origins
                .iter()
                .map(|origin| canonical_origin(origin))
                .collect()
        } else if loopback {
            LOOPBACK_NAMES
                .iter()
                .map(|name| format!("{scheme}://{name}:{port}"))
                .collect()
        } else {
            Vec::new()
        };
        Self { hosts, origins }
    }

    /// Whether a request with these `headers` (and `uri`, for a request in absolute form) may
    /// be served.
    pub(crate) fn check(&self, headers: &HeaderMap, uri: &Uri) -> Result<(), Foreign> {
        self.check_host(headers, uri)?;
        self.check_origin(headers)
    }

    /// Whether the request's `Host` (or `uri`'s authority) is one served.
    pub(crate) fn check_host(&self, headers: &HeaderMap, uri: &Uri) -> Result<(), Foreign> {
        if let Some(hosts) = &self.hosts {
            let host = headers
                .get(header::HOST)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
                .or_else(|| uri.authority().map(|authority| authority.to_string()))
                .unwrap_or_default();
            if !hosts.iter().any(|allowed| host_matches(allowed, &host)) {
                return Err(Foreign::Host(bounded(&host)));
            }
        }
        Ok(())
    }

    /// Whether every `Origin` the request carries (none is fine) is one served.
    pub(crate) fn check_origin(&self, headers: &HeaderMap) -> Result<(), Foreign> {
        for origin in headers.get_all(header::ORIGIN) {
            let origin = String::from_utf8_lossy(origin.as_bytes());
            if !self.origins.contains(&canonical_origin(&origin)) {
                return Err(Foreign::Origin(bounded(&origin)));
            }
        }
        Ok(())
    }
}

/// An allowed host with a port matches only that port; one without, any port.
fn host_matches(allowed: &str, host: &str) -> bool {
    let host = host.trim().to_ascii_lowercase();
    allowed == host || (is_portless(allowed) && name_of(&host) == allowed)
}

/// A host without its port (`[::1]:8080` → `[::1]`).
fn name_of(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port))
            if !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && is_portless(name) =>
        {
            name
        }
        _ => host,
    }
}

/// Whether a host as the flag gave it names no port.
fn is_portless(host: &str) -> bool {
    match host.strip_prefix('[') {
        Some(bracketed) => bracketed.ends_with(']'),
        None => !host.contains(':'),
    }
}

/// An origin as compared: lower case, without a trailing slash.
fn canonical_origin(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// The client's value, bounded for a message.
fn bounded(value: &str) -> String {
    value.chars().take(128).collect()
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn request(host: Option<&str>, origin: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(host) = host {
            headers.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        }
        if let Some(origin) = origin {
            headers.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
        }
        headers
    }

    fn allows(origins: &Origins, host: Option<&str>, origin: Option<&str>) -> bool {
        origins
            .check(&request(host, origin), &Uri::from_static("/mcp"))
            .is_ok()
    }

    #[test]
    fn a_loopback_proxy_serves_loopback_names_of_its_port_only() {
        let origins = Origins::new("127.0.0.1:8080".parse().unwrap(), "http", &[], &[]);
        for host in [
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "LocalHost:8080",
        ] {
            assert!(allows(&origins, Some(host), None), "{host}");
        }
        for host in [
            "evil.example.com",
            "evil.example.com:8080",
            "localhost:9090",
            "localhost",
            "",
        ] {
            assert!(!allows(&origins, Some(host), None), "{host}");
        }
        assert!(!allows(&origins, None, None));
        assert!(allows(
            &origins,
            Some("localhost:8080"),
            Some("http://localhost:8080")
        ));
        assert!(allows(
            &origins,
            Some("localhost:8080"),
            Some("http://127.0.0.1:8080/")
        ));
        for origin in [
            "http://evil.example.com",
            "null",
            "https://localhost:8080",
            "http://localhost:9",
        ] {
            assert!(
                !allows(&origins, Some("localhost:8080"), Some(origin)),
                "{origin}"
            );
        }
    }

    #[test]
    fn flags_name_the_hosts_and_origins_elsewhere() {
        let hosts = [
            "mcp.example.com".to_owned(),
            "gw.example.com:8443".to_owned(),
        ];
        let allowed = ["https://app.example.com".to_owned()];
        let origins = Origins::new("0.0.0.0:8443".parse().unwrap(), "https", &hosts, &allowed);
        assert!(allows(&origins, Some("mcp.example.com"), None));
        assert!(allows(&origins, Some("mcp.example.com:8443"), None));
        assert!(allows(&origins, Some("gw.example.com:8443"), None));
        assert!(!allows(&origins, Some("gw.example.com:9"), None));
        assert!(!allows(&origins, Some("localhost:8443"), None));
        assert!(allows(
            &origins,
            Some("mcp.example.com"),
            Some("https://app.example.com")
        ));
        assert!(!allows(
            &origins,
            Some("mcp.example.com"),
            Some("https://evil.example.com")
        ));

        // Elsewhere without flags: any host, and no browser origin.
        let open = Origins::new("0.0.0.0:8080".parse().unwrap(), "http", &[], &[]);
        assert!(allows(&open, Some("anything:1"), None));
        assert!(!allows(
            &open,
            Some("anything:1"),
            Some("http://anything:1")
        ));
    }
}
