//! Unit tests of contracts, registries and policy files.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::{context::Target, fingerprint::FingerprintRules};

fn target() -> Target {
    "deploy-api.internal.example/mcp".into()
}

#[test]
fn declared_contracts_win_and_unlisted_tools_are_irreversible() {
    let registry = ContractRegistry::builder()
        .tool("list_branches", ToolContract::read_only())
        .build()
        .unwrap();
    let r = registry.resolve("list_branches", &target(), None).unwrap();
    assert_eq!(
        (r.contract.class(), r.source),
        (RetryClass::ReadOnly, ContractSource::Declared)
    );
    let r = registry.resolve("deploy_release", &target(), None).unwrap();
    assert_eq!(
        (r.contract.class(), r.source),
        (RetryClass::Irreversible, ContractSource::UnlistedDefault)
    );
}

#[test]
fn with_class_overrides_the_class_and_keeps_the_other_terms() {
    let registry = ContractRegistry::builder()
        .tool(
            "deploy_release",
            ToolContract::irreversible().link_window(Duration::from_secs(90)),
        )
        .build()
        .unwrap()
        .with_class("deploy_release", RetryClass::Idempotent)
        .with_class("list_branches", RetryClass::ReadOnly);
    let r = registry.resolve("deploy_release", &target(), None).unwrap();
    assert_eq!(r.contract.class(), RetryClass::Idempotent);
    assert_eq!(r.contract.link_window_duration(), Duration::from_secs(90));
    let r = registry.resolve("list_branches", &target(), None).unwrap();
    assert_eq!(
        (r.contract.class(), r.source),
        (RetryClass::ReadOnly, ContractSource::Declared)
    );
}

#[test]
fn annotations_count_only_for_trusted_servers() {
    let read_only: ToolAnnotations = serde_json::from_value(json!({"readOnlyHint": true})).unwrap();
    let idempotent: ToolAnnotations =
        serde_json::from_value(json!({"idempotentHint": true, "destructiveHint": false})).unwrap();
    let untrusted = ContractRegistry::default();
    for a in [&read_only, &idempotent] {
        let r = untrusted.resolve("t", &target(), Some(a)).unwrap();
        assert_eq!(r.contract.class(), RetryClass::Irreversible);
    }
    let trusted = ContractRegistry::builder()
        .trust_server(target())
        .build()
        .unwrap();
    let r = trusted.resolve("t", &target(), Some(&read_only)).unwrap();
    assert_eq!(
        (r.contract.class(), r.source),
        (RetryClass::ReadOnly, ContractSource::TrustedAnnotations)
    );
    let r = trusted.resolve("t", &target(), Some(&idempotent)).unwrap();
    assert_eq!(r.contract.class(), RetryClass::Idempotent);
    // Trust is per server.
    let r = trusted
        .resolve("t", &"elsewhere/mcp".into(), Some(&read_only))
        .unwrap();
    assert_eq!(r.contract.class(), RetryClass::Irreversible);
    // Default annotations (all hints absent) mean nothing is promised.
    let r = trusted
        .resolve("t", &target(), Some(&ToolAnnotations::default()))
        .unwrap();
    assert_eq!(r.contract.class(), RetryClass::Irreversible);
}

#[test]
fn strict_mode_refuses_tools_without_a_contract() {
    let registry = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .trust_server(target())
        .strict(true)
        .build()
        .unwrap();
    assert!(registry.resolve("deploy_release", &target(), None).is_ok());
    let err = registry
        .resolve(
            "drop_database",
            &target(),
            Some(&ToolAnnotations {
                read_only_hint: Some(true),
                ..Default::default()
            }),
        )
        .unwrap_err();
    assert_eq!(err.tool, "drop_database");
    assert!(err.to_string().contains("no contract"), "{err}");
}

#[test]
fn invalid_contracts_are_reported_by_build() {
    let err = ContractRegistry::builder()
        .tool(
            "t",
            ToolContract::idempotent().fingerprint(FingerprintRules::new().drop("note")),
        )
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("tools.t.fingerprint"), "{err}");
    let err = ContractRegistry::builder()
        .tool(
            "t",
            ToolContract::idempotent()
                .link_window(Duration::from_secs(7200))
                .retention(Duration::from_secs(60)),
        )
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("link_window"), "{err}");
}

const POLICY: &str = r#"
    strict = true
    trusted_servers = ["docs.internal.example/mcp"]

    [unlisted]
    link_window = "5m"

    [tools.deploy_release]
    class = "irreversible"
    link_window = "15m"
    retention = "7d"
    max_result_bytes = 65536

    [tools.deploy_release.fingerprint]
    drop = ["/note"]
    secrets = ["/approval_token"]

    [tools.list_branches]
    class = "read-only"
    keep_results = false
"#;

#[test]
fn a_toml_policy_loads() {
    let registry = ContractRegistry::from_toml_str(POLICY).unwrap();
    assert!(registry.is_strict());
    let deploy = registry
        .resolve("deploy_release", &target(), None)
        .unwrap()
        .contract;
    assert_eq!(deploy.class(), RetryClass::Irreversible);
    assert_eq!(deploy.link_window_duration(), Duration::from_secs(900));
    assert_eq!(deploy.retention_duration(), Duration::from_secs(7 * 86400));
    assert_eq!(deploy.max_result_size(), 65536);
    assert_eq!(deploy.fingerprint_rules().secret_paths().count(), 1);
    let list = registry
        .resolve("list_branches", &target(), None)
        .unwrap()
        .contract;
    assert_eq!(list.class(), RetryClass::ReadOnly);
    assert!(!list.keeps_results());
    assert_eq!(registry.max_retention(), Duration::from_secs(7 * 86400));
}

#[test]
fn a_json_policy_loads() {
    let registry = ContractRegistry::from_json_str(
        r#"{"tools": {"create_payment": {"class": "idempotent", "link_window": "1h", "fingerprint": {"drop": ["/memo"]}}}}"#,
    )
    .unwrap();
    let c = registry
        .resolve("create_payment", &target(), None)
        .unwrap()
        .contract;
    assert_eq!(
        (c.class(), c.link_window_duration()),
        (RetryClass::Idempotent, Duration::from_secs(3600))
    );
}

#[test]
fn policy_errors_name_the_bad_key() {
    let cases = [
        (
            r#"[tools.t]
            class = "sometimes""#,
            "tools.t.class",
        ),
        (
            r#"[tools.t]
            class = "idempotent"
            link_windw = "5m""#,
            "link_windw",
        ),
        (
            r#"[tools.t]
            class = "idempotent"
            link_window = "soon""#,
            "tools.t.link_window",
        ),
        (
            r#"[tools.t]
            class = "idempotent"
            fingerprint = { drop = ["note"] }"#,
            "tools.t.fingerprint",
        ),
        (
            r#"[tools.t]
            class = "idempotent"
            fingerprint = { normalize = { "/x" = "shout" } }"#,
            "shout",
        ),
        ("strict = \"yes\"", "strict"),
        ("[tools.t]\nclass = ", "class"),
    ];
    for (text, needle) in cases {
        let err = ContractRegistry::from_toml_str(text)
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{needle:?} not in {err:?}");
    }
    let err = ContractRegistry::from_json_str(
        r#"{"tools": {"t": {"class": "idempotent", "retention": 5}}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("tools.t.retention"), "{err}");
}

#[test]
fn from_path_reads_toml_and_json_and_names_the_file() {
    let dir = std::env::temp_dir().join(format!("mrg-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toml_path = dir.join("policy.toml");
    std::fs::write(&toml_path, POLICY).unwrap();
    assert!(ContractRegistry::from_path(&toml_path).unwrap().is_strict());
    let json_path = dir.join("policy.json");
    std::fs::write(&json_path, r#"{"strict": true, "tools": {}}"#).unwrap();
    assert!(ContractRegistry::from_path(&json_path).unwrap().is_strict());
    let missing = ContractRegistry::from_path(dir.join("missing.toml")).unwrap_err();
    assert!(missing.to_string().contains("missing.toml"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[derive(Debug)]
struct NeverApplied;

#[async_trait::async_trait]
impl StatusProbe for NeverApplied {
    async fn probe(&self, _: ProbeRequest<'_>) -> ProbeOutcome {
        ProbeOutcome::NotApplied
    }
}

#[test]
fn a_status_probe_on_a_tool_that_is_not_recoverable_is_refused_by_build() {
    for contract in [
        ToolContract::read_only(),
        ToolContract::idempotent(),
        ToolContract::irreversible(),
    ] {
        let err = ContractRegistry::builder()
            .tool("t", contract.status_probe(NeverApplied))
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("tools.t: a status probe"), "{err}");
    }
    let registry = ContractRegistry::builder()
        .tool("t", ToolContract::recoverable().status_probe(NeverApplied))
        .build()
        .unwrap();
    let r = registry.resolve("t", &target(), None).unwrap();
    assert!(r.contract.probe().is_some());
    // The registry stays cloneable and printable with a probe inside.
    assert!(format!("{:?}", registry.clone()).contains("NeverApplied"));
    // A probe added to a registry read from a policy file: the same rule, by name.
    let plain = ContractRegistry::builder()
        .tool("t", ToolContract::recoverable())
        .tool("i", ToolContract::idempotent())
        .build()
        .unwrap();
    assert!(plain.clone().with_status_probe("t", NeverApplied).is_ok());
    for tool in ["i", "typo"] {
        let err = plain
            .clone()
            .with_status_probe(tool, NeverApplied)
            .unwrap_err();
        assert!(err.to_string().contains(&format!("tools.{tool}:")), "{err}");
    }
    // Overriding the class drops the probe rather than leave it unused.
    let registry = registry.with_class("t", RetryClass::Irreversible);
    assert!(
        registry
            .resolve("t", &target(), None)
            .unwrap()
            .contract
            .probe()
            .is_none()
    );
}

/// A retention shorter than the link window is refused, naming the tool, the fix and the line
/// where the retention is written (or the table, when it is not); in `[unlisted]` too.
#[test]
fn a_retention_shorter_than_the_link_window_is_refused_with_its_line() {
    let text = "strict = false\n\n[tools.other]\nclass = \"read_only\"\n\n[tools.deploy]\nclass = \"irreversible\"\nlink_window = \"10m\"\nretention = \"1m\"\n";
    let err = ContractRegistry::from_toml_str(text)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tools.deploy: retention (1m) is shorter than link_window (10m)")
            && err.contains("make retention at least 10m")
            && err.ends_with("(line 9)"),
        "{err}"
    );
    let text = "[unlisted]\nlink_window = \"2d\"\n";
    let err = ContractRegistry::from_toml_str(text)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("<unlisted>") && err.ends_with("(line 1)"),
        "{err}"
    );
    // A window inside its retention is valid.
    ContractRegistry::from_toml_str(
        "[tools.t]\nclass = \"irreversible\"\nlink_window = \"1s\"\nretention = \"2s\"\n",
    )
    .unwrap();
}
