//! [`ResumeLayer`] and its configuration.

use std::time::Duration;

use tower_layer::Layer;

use super::Resume;

/// Builds [`Resume`]; see the [module docs](super).
///
/// Defaults: 3 attempts per broken stream, the server's `retry:` capped at 5 s, a 250 ms
/// backoff (doubling) when the server sent none, 4 MiB per event.
#[derive(Debug, Clone)]
pub struct ResumeLayer {
    config: Config,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Config {
    pub(super) max_attempts: u32,
    pub(super) max_delay: Duration,
    pub(super) backoff: Duration,
    pub(super) max_event_size: usize,
}

impl Default for ResumeLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl ResumeLayer {
    /// The layer with its defaults.
    pub fn new() -> Self {
        Self {
            config: Config {
                max_attempts: 3,
                max_delay: Duration::from_secs(5),
                backoff: Duration::from_millis(250),
                max_event_size: crate::protocol::sse::DEFAULT_MAX_EVENT_SIZE,
            },
        }
    }

    /// How many GETs one broken stream may take.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.config.max_attempts = attempts;
        self
    }

    /// The longest wait before a GET, whatever the server's `retry:` says.
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.config.max_delay = delay;
        self
    }

    /// The first wait when the server sent no `retry:` (doubles per attempt).
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.config.backoff = backoff;
        self
    }

    /// The largest SSE event accepted on a stream.
    pub fn max_event_size(mut self, max: usize) -> Self {
        self.config.max_event_size = max;
        self
    }
}

impl<S> Layer<S> for ResumeLayer {
    type Service = Resume<S>;

    fn layer(&self, inner: S) -> Resume<S> {
        Resume::new(inner, self.config)
    }
}
