//! One log line per guarded `tools/call`, written when the call's span closes (its outcome
//! recorded, its answer delivered or lost): method, tool, execution id, decision, outcome,
//! status, duration.
//!
//! Written here rather than as a tracing event: an event emitted while the subscriber closes a
//! span would not reach the subscriber (tracing refuses to re-enter it).

use std::{
    io::Write,
    time::{Instant, SystemTime},
};

use serde_json::{Map, Value, json};
use tracing::{
    Subscriber,
    field::{Field, Visit},
    span,
};
use tracing_subscriber::{Layer, layer::Context, registry::LookupSpan};

use crate::LogFormat;

/// The library's span of one guarded `tools/call`.
const CALL_SPAN: &str = "tools_call";

/// The fields the line shows, in its order.
const FIELDS: [&str; 5] = ["tool", "execution_id", "decision", "outcome", "status"];

/// Writes the line of each `tools_call` span when it closes.
pub(crate) struct CallLines {
    format: LogFormat,
}

impl CallLines {
    pub(crate) fn new(format: LogFormat) -> Self {
        Self { format }
    }

    fn line(&self, call: &Call) -> String {
        let duration_ms = call.started.elapsed().as_secs_f64() * 1000.0;
        let at = humantime::format_rfc3339_micros(SystemTime::now());
        match self.format {
            LogFormat::Json => {
                let mut fields = Map::new();
                fields.insert("message".into(), json!("call"));
                fields.insert("method".into(), json!("tools/call"));
                for name in FIELDS {
                    if let Some(value) = call.fields.get(name) {
                        fields.insert(name.into(), value.clone());
                    }
                }
                fields.insert(
                    "duration_ms".into(),
                    json!((duration_ms * 1000.0).round() / 1000.0),
                );
                json!({
                    "timestamp": at.to_string(),
                    "level": "INFO",
                    "target": "mcp_replay_guard::call",
                    "fields": fields,
                })
                .to_string()
            }
            LogFormat::Text => {
                let mut line = format!("{at}  INFO mcp_replay_guard::call: call method=tools/call");
                for name in FIELDS {
                    if let Some(value) = call.fields.get(name) {
                        let shown = value
                            .as_str()
                            .map_or_else(|| value.to_string(), str::to_owned);
                        line.push_str(&format!(" {name}={shown}"));
                    }
                }
                line.push_str(&format!(" duration_ms={duration_ms:.1}"));
                line
            }
        }
    }
}

/// What the line of one call knows so far.
struct Call {
    started: Instant,
    fields: Map<String, Value>,
}

impl Visit for Call {
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.keep(field, json!(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.keep(field, json!(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.keep(field, json!(value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.keep(field, json!(format!("{value:?}")));
    }
}

impl Call {
    fn keep(&mut self, field: &Field, value: Value) {
        if FIELDS.contains(&field.name()) {
            self.fields.insert(field.name().to_owned(), value);
        }
    }
}

impl<S> Layer<S> for CallLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != CALL_SPAN {
            return;
        }
        let mut call = Call {
            started: Instant::now(),
            fields: Map::new(),
        };
        attrs.record(&mut call);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(call);
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(call) = span.extensions_mut().get_mut::<Call>()
        {
            values.record(call);
        }
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let extensions = span.extensions();
        let Some(call) = extensions.get::<Call>() else {
            return;
        };
        let line = self.line(call);
        // A closed or full stderr loses the line, never the call.
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}
