//! The MCP tools served by the test server. Every tool records one
//! [`ToolRun`](super::ToolRun) per execution of its body, including the
//! `Idempotency-Key` header of the HTTP request that carried the call (read
//! from the `http::request::Parts` rmcp injects into the request context).

use std::sync::Arc;

use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    handler::server::{router::tool::ToolRouter, wrapper::Parameters},
    model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig},
    service::RequestContext,
    tool, tool_handler, tool_router,
};
use serde::Deserialize;
use serde_json::json;

use super::server::ServerState;

/// Names of all tools the test server offers.
/// One contract per retry class, on the tools that behave like it: `list_branches`
/// (read_only), `create_payment` (idempotent), `rotate_credential` (recoverable),
/// `deploy_release` (irreversible).
pub fn one_contract_per_class() -> mcp_replay_guard::contract::ContractRegistry {
    use mcp_replay_guard::contract::{ContractRegistry, ToolContract};
    ContractRegistry::builder()
        .tool("list_branches", ToolContract::read_only())
        .tool("create_payment", ToolContract::idempotent())
        .tool("rotate_credential", ToolContract::recoverable())
        .tool("deploy_release", ToolContract::irreversible())
        .build()
        .expect("valid contracts")
}

pub const TOOL_NAMES: [&str; 6] = [
    "deploy_release",
    "create_payment",
    "rotate_credential",
    "credential_status",
    "list_branches",
    "slow_deploy",
];

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DeployReleaseArgs {
    /// Service to deploy.
    pub service: String,
    /// Version to deploy.
    pub version: String,
    /// Optional region.
    #[serde(default)]
    pub region: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CreatePaymentArgs {
    /// Amount in minor units.
    pub amount: i64,
    /// ISO currency code.
    pub currency: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CredentialArgs {
    /// Credential name.
    pub name: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SlowDeployArgs {
    /// Service to deploy.
    pub service: String,
}

fn result(text: String, structured: serde_json::Value) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(structured);
    result
}

/// The rmcp server handler: one instance per session (or per stateless
/// request), all sharing one [`ServerState`].
#[derive(Clone)]
pub struct TestTools {
    state: Arc<ServerState>,
    tool_router: ToolRouter<Self>,
}

impl TestTools {
    /// The tool's answer once its effect is made: `result`, or the internal error the test
    /// scheduled for this run ([`ServerState::fail_next_after_effect`]).
    fn answer(&self, tool: &str, result: CallToolResult) -> Result<CallToolResult, ErrorData> {
        if self.state.take_failure_after_effect(tool) {
            return Err(ErrorData::internal_error(
                format!("{tool} failed after its effect"),
                None,
            ));
        }
        Ok(result)
    }
}

#[tool_router]
impl TestTools {
    pub fn new(state: Arc<ServerState>) -> Self {
        TestTools {
            state,
            tool_router: Self::tool_router(),
        }
    }

    #[tool(description = "Deploy a release of a service (side effect; counts)")]
    async fn deploy_release(
        &self,
        Parameters(args): Parameters<DeployReleaseArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let arguments =
            json!({"service": args.service, "version": args.version, "region": args.region});
        self.state.record_start("deploy_release");
        let n = self.state.record_run("deploy_release", &ctx, arguments);
        self.answer(
            "deploy_release",
            result(
                format!("deployed {} {}", args.service, args.version),
                json!({"deployment": n}),
            ),
        )
    }

    // Annotated idempotent (a hint the guard honours only for a trusted server).
    #[tool(
        description = "Create a payment (side effect; counts; records but does not dedupe Idempotency-Key)",
        annotations(idempotent_hint = true, destructive_hint = false)
    )]
    async fn create_payment(
        &self,
        Parameters(args): Parameters<CreatePaymentArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let arguments = json!({"amount": args.amount, "currency": args.currency});
        self.state.record_start("create_payment");
        let n = self.state.record_run("create_payment", &ctx, arguments);
        self.answer(
            "create_payment",
            result(
                format!("payment {n}"),
                json!({"payment": n, "amount": args.amount, "currency": args.currency}),
            ),
        )
    }

    #[tool(description = "Rotate a credential (side effect; counts)")]
    async fn rotate_credential(
        &self,
        Parameters(args): Parameters<CredentialArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.state.record_start("rotate_credential");
        let rotations = self.state.rotate(&args.name);
        let n = self
            .state
            .record_run("rotate_credential", &ctx, json!({"name": args.name}));
        self.answer(
            "rotate_credential",
            result(
                format!("rotated {} ({rotations})", args.name),
                json!({"rotation": n, "name": args.name, "rotations": rotations}),
            ),
        )
    }

    #[tool(description = "Read-only status probe: has a credential been rotated?")]
    async fn credential_status(
        &self,
        Parameters(args): Parameters<CredentialArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.state.record_start("credential_status");
        let rotations = self.state.rotations(&args.name);
        self.state
            .record_run("credential_status", &ctx, json!({"name": args.name}));
        self.answer(
            "credential_status",
            result(
                format!("credential {} rotated {rotations} time(s)", args.name),
                json!({"rotated": rotations > 0, "rotations": rotations}),
            ),
        )
    }

    #[tool(description = "Read-only: list branches")]
    async fn list_branches(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.state.record_start("list_branches");
        self.state.record_run("list_branches", &ctx, json!({}));
        self.answer(
            "list_branches",
            result(
                "main\nrelease".to_owned(),
                json!({"branches": ["main", "release"]}),
            ),
        )
    }

    #[tool(description = "Deploy slowly: sleeps, then counts (for concurrency tests)")]
    async fn slow_deploy(
        &self,
        Parameters(args): Parameters<SlowDeployArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.state.record_start("slow_deploy");
        tokio::time::sleep(self.state.slow_tool_delay()).await;
        let n = self
            .state
            .record_run("slow_deploy", &ctx, json!({"service": args.service}));
        self.answer(
            "slow_deploy",
            result(
                format!("slow deployed {}", args.service),
                json!({"deployment": n}),
            ),
        )
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for TestTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("mcp-replay-guard-test-server", "0.0.0"))
            .with_instructions("Test server whose tools count their side effects")
    }
}
