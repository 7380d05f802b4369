//! What the guard knows of one `tools/call`: its fingerprint, contract and caller.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Response, StatusCode};

use super::{answer, config::Config};

use crate::{
    Actor, CredentialRef, IDEMPOTENCY_KEY, IdempotencyKey, IntentScope, Target,
    contract::StatusProbe,
    execution::{ClientInfo, Dispatch, RetryClass, Timestamp},
    fingerprint::{ActionRecord, Fingerprint},
    protocol::{Era, ToolCall},
};

/// What the guard knows of one `tools/call` once it is fingerprinted.
pub(super) struct Intent {
    pub(super) call: ToolCall,
    pub(super) fingerprint: Fingerprint,
    pub(super) actor: Actor,
    pub(super) intent_scope: IntentScope,
    pub(super) target: Target,
    pub(super) credential_ref: Option<CredentialRef>,
    pub(super) class: RetryClass,
    /// The contract's status probe (recoverable tools only).
    pub(super) probe: Option<Arc<dyn StatusProbe>>,
    pub(super) link_window: Duration,
    pub(super) retention: Duration,
    pub(super) keep_results: bool,
    pub(super) max_result_bytes: usize,
    /// Each dispatch carries its key in `params._meta` too.
    pub(super) key_in_meta: bool,
    pub(super) session_id: Option<String>,
    pub(super) client_info: Option<ClientInfo>,
    pub(super) caller_key: Option<IdempotencyKey>,
    /// The caller's era: the shape of every answer the guard writes for this call.
    pub(super) era: Era,
    /// When the call reached the guard: a twin's result delivered after it is still this
    /// call's ([`Claim::asked_at`](crate::execution::Claim::asked_at)).
    pub(super) asked_at: Timestamp,
    /// The call attached to an attempt of its intent in flight and waited
    /// ([`Claim::waited`](crate::execution::Claim::waited)).
    pub(super) waited: std::sync::atomic::AtomicBool,
}

impl Intent {
    /// The intent of `call`: its caller and target (a request's extensions over the layer's
    /// defaults), its contract, and its fingerprint. A key the caller sent that is no key,
    /// and a tool no contract covers, are answered here, unsent.
    pub(super) fn of(
        config: &Config,
        parts: &http::request::Parts,
        call: ToolCall,
        session_id: Option<String>,
        era: Era,
    ) -> Result<Intent, Box<Response<Bytes>>> {
        let ext = &parts.extensions;
        let actor = ext.get::<Actor>().unwrap_or(&config.actor).clone();
        let intent_scope = ext
            .get::<IntentScope>()
            .unwrap_or(&config.intent_scope)
            .clone();
        let credential_ref = ext
            .get::<CredentialRef>()
            .or(config.credential_ref.as_ref())
            .cloned();
        let target = config.target_of(parts);
        let caller_key = match parts
            .headers
            .get(IDEMPOTENCY_KEY)
            .map(IdempotencyKey::from_header)
        {
            None => None,
            Some(Ok(key)) => Some(key),
            Some(Err(error)) => {
                return Err(Box::new(answer::jsonrpc_error(
                    StatusCode::BAD_REQUEST,
                    Some(&call.id),
                    -32600,
                    format!("{error}; nothing was sent"),
                )));
            }
        };
        let resolved = config
            .contracts
            .resolve(
                &call.name,
                &target,
                config.annotations_of(&target, &call.name).as_ref(),
            )
            .map_err(|error| {
                Box::new(answer::jsonrpc_error(
                    StatusCode::OK,
                    Some(&call.id),
                    -32601,
                    format!("{error}; nothing was sent"),
                ))
            })?;
        let contract = resolved.contract;
        let record =
            ActionRecord::of_tool_call(actor.clone(), intent_scope.clone(), &call, target.clone());
        let record = match &credential_ref {
            Some(c) => record.credential_ref(c.clone()),
            None => record,
        };
        let fingerprint = config.key.fingerprint(record, contract.fingerprint_rules());
        // Set by whoever knows the session's `initialize` (the proxy); a 2026-07-28 request
        // names its client itself.
        let client_info = ext.get::<ClientInfo>().cloned().or_else(|| {
            call.meta
                .as_ref()?
                .get("io.modelcontextprotocol/clientInfo")
                .and_then(ClientInfo::from_json)
        });
        Ok(Intent {
            call,
            fingerprint,
            actor,
            intent_scope,
            target,
            credential_ref,
            class: contract.class(),
            probe: contract.probe().cloned(),
            link_window: contract.link_window_duration(),
            retention: contract.retention_duration(),
            keep_results: contract.keeps_results(),
            max_result_bytes: contract.max_result_size(),
            key_in_meta: contract
                .sends_execution_id_in_meta()
                .unwrap_or(config.execution_id_in_meta),
            session_id,
            client_info,
            caller_key,
            era,
            asked_at: Timestamp::now(),
            waited: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// What each attempt's `dispatched` records of this call.
    pub(super) fn dispatch(&self) -> Dispatch {
        Dispatch {
            caller_key: self.caller_key.clone(),
            jsonrpc_id: Some(self.call.id.clone()),
            session_id: self.session_id.clone(),
            client_info: self.client_info.clone(),
        }
    }
}
