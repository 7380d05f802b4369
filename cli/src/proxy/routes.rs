//! `Route`: one upstream of the proxy under a path prefix of its own, with its guard (its policy,
//! its target in the ledger and in every fingerprint), the credential the proxy holds for it, and
//! its clients. `Routes`: every route, matched by the request's path.

use std::{pin::Pin, sync::Arc};

use http::{HeaderMap, Request, Uri};
use hyper::rt::Executor;
use hyper_util::client::legacy::{Client, connect::Connect};
use mcp_replay_guard::guard::{GuardLayer, GuardRequestBody};
use tower::{ServiceBuilder, ServiceExt, util::BoxCloneSyncService};

use super::{MetadataClient, Upstream, admin::LastAnswer};

/// One upstream, under its path prefix.
pub(super) struct Route {
    /// The path its clients use: the prefix itself or below it (`/` for every path).
    prefix: String,
    pub(super) upstream: Uri,
    /// The guard over the upstream's client.
    pub(super) guard: Upstream,
    /// Set on every upstream request in place of the client's header of that name.
    pub(super) held: HeaderMap,
    /// Around the guard: the OAuth metadata requests.
    pub(super) metadata: MetadataClient,
    /// When the upstream last answered anything (`/readyz`).
    pub(super) last_answer: Arc<LastAnswer>,
}

impl Route {
    /// The route under `prefix` to `upstream`, guarded by `layer`, connecting with `connector`
    /// (its connection tasks spawned on `executor`).
    pub(super) fn new<C, E>(
        prefix: &str,
        upstream: Uri,
        layer: &GuardLayer,
        connector: C,
        executor: E,
        held: HeaderMap,
    ) -> Self
    where
        C: Connect + Clone + Send + Sync + 'static,
        E: Executor<Pin<Box<dyn Future<Output = ()> + Send>>> + Clone + Send + Sync + 'static,
    {
        let last_answer = Arc::new(LastAnswer::default());
        let answered = |last: Arc<LastAnswer>| {
            move |response| {
                last.now();
                response
            }
        };
        let metadata = BoxCloneSyncService::new(
            Client::builder(executor.clone())
                .build(connector.clone())
                .map_response(answered(last_answer.clone())),
        );
        let guard = ServiceBuilder::new()
            .layer(layer.clone())
            .service(BoxCloneSyncService::new(
                Client::builder(executor)
                    .build(connector)
                    .map_request(|mut request: Request<GuardRequestBody>| {
                        // Sent from inside the guard's span: it is the upstream's parent.
                        crate::trace_context::inject(request.headers_mut());
                        request
                    })
                    .map_response(answered(last_answer.clone())),
            ));
        Self {
            prefix: prefix.trim_end_matches('/').to_owned(),
            upstream,
            guard,
            held,
            metadata,
            last_answer,
        }
    }

    /// The prefix, as configured (`/` for every path).
    pub(super) fn prefix(&self) -> &str {
        if self.prefix.is_empty() {
            "/"
        } else {
            &self.prefix
        }
    }

    /// Whether a request for `path` is this route's.
    fn serves(&self, path: &str) -> bool {
        prefix_serves(&self.prefix, path)
    }
}

/// Whether `prefix` (without a trailing `/`; empty for every path) serves `path`: the prefix
/// itself, or a path below it (`/deploy` serves `/deploy/mcp`, never `/deployments`).
fn prefix_serves(prefix: &str, path: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Every route of the proxy, the longest prefix first.
pub(super) struct Routes(Vec<Route>);

impl Routes {
    pub(super) fn new(mut routes: Vec<Route>) -> Self {
        routes.sort_by_key(|route| std::cmp::Reverse(route.prefix.len()));
        Self(routes)
    }

    /// The route of a request for `path`: the longest prefix that serves it.
    pub(super) fn find(&self, path: &str) -> Option<&Route> {
        self.0.iter().find(|route| route.serves(path))
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Route> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_serves_itself_and_the_paths_below_it_only() {
        for (prefix, path, serves) in [
            ("", "/mcp", true),
            ("", "/", true),
            ("/deploy", "/deploy", true),
            ("/deploy", "/deploy/mcp", true),
            ("/deploy", "/deployments/mcp", false),
            ("/deploy", "/mcp", false),
            ("/deploy/eu", "/deploy/mcp", false),
        ] {
            assert_eq!(prefix_serves(prefix, path), serves, "{prefix:?} {path:?}");
        }
    }
}
