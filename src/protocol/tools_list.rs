//! The tools a `tools/list` response names, with their annotations: what the guard reads from
//! a trusted server's list so that an unlisted tool of that server can be resolved from its
//! hints.

use serde::Deserialize;

use super::{
    RequestId,
    response::{ResponseTo, response_to},
};

/// The MCP annotations of a tool, as `tools/list` reports them. Untrusted hints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ToolAnnotations {
    /// `readOnlyHint` (the specification's default is false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// `destructiveHint` (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// `idempotentHint` (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// `openWorldHint` (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
}

/// The method name of a tool listing.
pub(crate) const TOOLS_LIST: &str = "tools/list";

/// The annotations of each tool in `message`, if it is the JSON-RPC response to the
/// `tools/list` request `id`: `(name, annotations)`, a tool without annotations getting the
/// default (no hint). `None` for any other message, an error, or a result that is not a list.
pub(crate) fn listed_annotations(
    message: &[u8],
    id: &RequestId,
) -> Option<Vec<(String, ToolAnnotations)>> {
    #[derive(Deserialize)]
    struct Listing {
        tools: Vec<Tool>,
    }
    #[derive(Deserialize)]
    struct Tool {
        name: String,
        // A malformed annotations object is no hint at all, not a reason to drop the list.
        #[serde(default, deserialize_with = "lenient")]
        annotations: ToolAnnotations,
    }
    fn lenient<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ToolAnnotations, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        Ok(serde_json::from_value(value).unwrap_or_default())
    }
    let ResponseTo::Result(raw) = response_to(message, id)? else {
        return None;
    };
    let listing: Listing = serde_json::from_str(raw.get()).ok()?;
    Some(
        listing
            .tools
            .into_iter()
            .map(|t| (t.name, t.annotations))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_tools_hints_from_the_response_to_its_id() {
        let id = RequestId::from(4);
        let body = br#"{"jsonrpc":"2.0","id":4,"result":{"tools":[
            {"name":"get_page","inputSchema":{},"annotations":{"readOnlyHint":true}},
            {"name":"put_page","inputSchema":{},"annotations":{"idempotentHint":true,"destructiveHint":false}},
            {"name":"drop_all","inputSchema":{}},
            {"name":"odd","inputSchema":{},"annotations":{"readOnlyHint":"yes"}}
        ],"nextCursor":"2"}}"#;
        let tools = listed_annotations(body, &id).unwrap();
        let names: Vec<_> = tools.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["get_page", "put_page", "drop_all", "odd"]);
        assert_eq!(tools[0].1.read_only_hint, Some(true));
        assert_eq!(
            (tools[1].1.idempotent_hint, tools[1].1.destructive_hint),
            (Some(true), Some(false))
        );
        assert_eq!(tools[2].1, ToolAnnotations::default());
        assert_eq!(tools[3].1, ToolAnnotations::default());
    }

    #[test]
    fn other_ids_errors_notifications_and_garbage_name_no_tools() {
        let id = RequestId::from("l");
        for message in [
            &br#"{"jsonrpc":"2.0","id":"other","result":{"tools":[{"name":"x"}]}}"#[..],
            br#"{"jsonrpc":"2.0","id":"l","error":{"code":-32601,"message":"no"}}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,
            br#"{"jsonrpc":"2.0","id":"l","result":{"content":[]}}"#,
            b"not json",
        ] {
            assert!(listed_annotations(message, &id).is_none());
        }
    }
}
