//! `ProtocolVersion` and `Era`: the MCP revisions this crate speaks, and which era each is.

use std::{fmt, str::FromStr};

/// A Streamable HTTP protocol revision of MCP, as named by the `MCP-Protocol-Version` header.
///
/// A request without the header is 2025-03-26, as the specification says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ProtocolVersion {
    /// 2025-03-26: Streamable HTTP is introduced; JSON-RPC batches are allowed.
    V2025_03_26,
    /// 2025-06-18: batches removed; `MCP-Protocol-Version` required after initialization.
    V2025_06_18,
    /// 2025-11-25: sessions and resumable SSE; experimental task-augmented calls.
    V2025_11_25,
    /// 2026-07-28: stateless; no resumption; `Mcp-Method` / `Mcp-Name` headers; Tasks extension.
    V2026_07_28,
}

/// The two ways MCP revisions treat a broken response stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Era {
    /// 2025-03-26 to 2025-11-25: `Mcp-Session-Id` sessions; a broken SSE stream is resumed with
    /// GET + `Last-Event-ID`, and a disconnect is not a cancellation.
    Sessions,
    /// 2026-07-28 and later: no sessions, no resumption; closing the stream cancels, and the
    /// client must re-issue the request with a new JSON-RPC id.
    Stateless,
}

impl ProtocolVersion {
    /// The revision assumed when a request carries no `MCP-Protocol-Version` header.
    pub const WITHOUT_HEADER: Self = Self::V2025_03_26;
    /// The newest revision this crate speaks.
    pub const LATEST: Self = Self::V2026_07_28;

    /// Every revision this crate speaks, oldest first.
    pub const ALL: [Self; 4] = [
        Self::V2025_03_26,
        Self::V2025_06_18,
        Self::V2025_11_25,
        Self::V2026_07_28,
    ];

    /// The revision a request names in its `MCP-Protocol-Version` header (surrounding
    /// whitespace ignored), or [`WITHOUT_HEADER`](Self::WITHOUT_HEADER) when it has none.
    pub fn from_header(header: Option<&str>) -> Result<Self, UnsupportedProtocolVersion> {
        header.map_or(Ok(Self::WITHOUT_HEADER), |v| v.trim().parse())
    }

    /// The revision a request's headers name ([`from_header`](Self::from_header)); `None` when
    /// the header is unreadable or names no revision this crate speaks.
    pub(crate) fn of_headers(headers: &http::HeaderMap) -> Option<Self> {
        match headers.get(&super::MCP_PROTOCOL_VERSION) {
            None => Some(Self::WITHOUT_HEADER),
            Some(v) => Self::from_header(Some(v.to_str().ok()?)).ok(),
        }
    }

    /// The revision's name, e.g. `"2025-11-25"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V2025_03_26 => "2025-03-26",
            Self::V2025_06_18 => "2025-06-18",
            Self::V2025_11_25 => "2025-11-25",
            Self::V2026_07_28 => "2026-07-28",
        }
    }

    /// Which era the revision belongs to.
    pub fn era(self) -> Era {
        if self >= Self::V2026_07_28 {
            Era::Stateless
        } else {
            Era::Sessions
        }
    }

    /// Whether a POST may carry a JSON-RPC batch (2025-03-26 only).
    pub fn allows_batches(self) -> bool {
        self == Self::V2025_03_26
    }

    /// Whether a broken SSE stream may be resumed with GET + `Last-Event-ID`.
    pub fn supports_resumption(self) -> bool {
        self.era() == Era::Sessions
    }

    /// Whether requests carry `Mcp-Method` / `Mcp-Name` headers that mirror the body.
    pub fn has_standard_headers(self) -> bool {
        self >= Self::V2026_07_28
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A protocol revision this crate does not speak.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported MCP protocol version {0:?}; this crate speaks 2025-03-26, 2025-06-18, 2025-11-25 and 2026-07-28"
)]
pub struct UnsupportedProtocolVersion(pub(crate) String);

impl FromStr for ProtocolVersion {
    type Err = UnsupportedProtocolVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnsupportedProtocolVersion(s.chars().take(32).collect()))
    }
}

crate::serde_display_fromstr!(ProtocolVersion);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_map_to_their_era_and_capabilities() {
        assert_eq!(ProtocolVersion::V2025_11_25.era(), Era::Sessions);
        assert_eq!(ProtocolVersion::V2026_07_28.era(), Era::Stateless);
        assert!(ProtocolVersion::V2025_03_26.allows_batches());
        assert!(!ProtocolVersion::V2025_06_18.allows_batches());
        assert!(ProtocolVersion::V2025_06_18.supports_resumption());
        assert!(!ProtocolVersion::V2026_07_28.supports_resumption());
        assert!(ProtocolVersion::V2026_07_28.has_standard_headers());
        assert!(!ProtocolVersion::V2025_11_25.has_standard_headers());
        for v in ProtocolVersion::ALL {
            assert_eq!(v.as_str().parse::<ProtocolVersion>().unwrap(), v);
        }
        assert!("2024-11-05".parse::<ProtocolVersion>().is_err());
    }
}
