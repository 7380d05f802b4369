//! Trusted annotations: what a trusted target's `tools/list` answer says of its tools, read as
//! the answer passes to the caller and kept (bounded) for the resolution of that target's tools
//! without a contract. An untrusted target's list is never read.

use http::HeaderMap;

use crate::{
    Target,
    contract::AnnotationCache,
    protocol::{
        RequestId,
        response::{Examined, ResponseScanner},
        tools_list::listed_annotations,
    },
};

/// Reads a `tools/list` answer as it streams (JSON or SSE) and records the tools' annotations
/// once the response to the request is seen.
#[derive(Debug)]
pub(super) struct ListWatch {
    scanner: ResponseScanner,
    id: RequestId,
    target: Target,
    cache: AnnotationCache,
    done: bool,
}

impl ListWatch {
    pub(super) fn new(
        headers: &HeaderMap,
        id: RequestId,
        target: Target,
        cache: AnnotationCache,
        max: usize,
    ) -> Self {
        Self {
            scanner: ResponseScanner::new(ResponseScanner::is_sse(headers), max),
            id,
            target,
            cache,
            done: false,
        }
    }

    /// Feeds a data frame of the answer.
    pub(super) fn feed(&mut self, chunk: &[u8]) {
        if self.done {
            return;
        }
        let Self {
            scanner,
            id,
            target,
            cache,
            done,
        } = self;
        scanner.feed(chunk, |message| {
            if let Some(listed) = listed_annotations(message, id) {
                cache.record(target, listed);
                *done = true;
            }
            Examined::Unread
        });
    }

    /// The answer ended: a JSON body is complete now.
    pub(super) fn end(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        if let Some(listed) = self
            .scanner
            .json_body()
            .and_then(|body| listed_annotations(body, &self.id))
        {
            self.cache.record(&self.target, listed);
        }
    }

    /// Whether the annotations were recorded (or the answer ended without them).
    pub(super) fn is_done(&self) -> bool {
        self.done
    }
}
