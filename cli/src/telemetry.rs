//! What the command tells its operator: log lines on stderr (one per guarded call), traces
//! over OTLP when an endpoint is configured, and the metrics `/metrics` renders.

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::{EnvFilter, Layer, layer::SubscriberExt, util::SubscriberInitExt};

use crate::{LogFormat, call_lines::CallLines};

/// The log filter without `RUST_LOG`: warnings, the command's own news, one line per call.
const DEFAULT_FILTER: &str = "warn,replay_guard=info,mcp_replay_guard::call=info";

/// The variable that names the OTLP endpoint (the OpenTelemetry specification's).
const OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The buckets of every latency histogram, in seconds: from a memory ledger's write to a slow
/// disk's sync.
const SECONDS_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Whether spans are exported (the proxy reads a request's trace context only then).
static TRACES_EXPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn traces_exported() -> bool {
    TRACES_EXPORTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// The trace exporter, for a command that ends with `std::process::exit` (stdio) to flush.
static PROVIDER: std::sync::OnceLock<SdkTracerProvider> = std::sync::OnceLock::new();

/// Exports what is still buffered when the command ends.
pub(crate) struct Telemetry;

impl Telemetry {
    /// Flushes the traces not yet exported (bounded by the exporter's own timeout).
    pub(crate) fn shut_down(self) {
        flush_traces();
    }
}

/// Exports the spans not yet exported and stops the exporter (once; bounded by the
/// exporter's own timeout): before the process ends, however it ends.
pub(crate) fn flush_traces() {
    if let Some(provider) = PROVIDER.get()
        && let Err(error) = provider.shutdown()
    {
        // Shut down already (the second of two calls): nothing was left to export.
        if !matches!(
            error,
            opentelemetry_sdk::error::OTelSdkError::AlreadyShutdown
        ) {
            eprintln!("warning: traces not exported at exit: {error}");
        }
    }
}

fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER))
}

/// Starts the log lines, and the trace export when an OTLP endpoint is configured
/// (`otlp_endpoint`, else [`OTLP_ENDPOINT`]).
pub(crate) fn init(format: LogFormat, otlp_endpoint: Option<&str>) -> Telemetry {
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter())
            .boxed(),
        LogFormat::Json => logs.json().with_ansi(false).with_filter(filter()).boxed(),
    };
    let calls = CallLines::new(format).with_filter(filter());
    let endpoint = otlp_endpoint
        .map(str::to_owned)
        .or_else(|| std::env::var(OTLP_ENDPOINT).ok().filter(|e| !e.is_empty()));
    let (traces, provider) = match endpoint.map(|endpoint| tracer_provider(&endpoint)) {
        Some(Ok(provider)) => {
            let tracer = provider.tracer("replay-guard");
            // Spans at info and above, from the guard and the command.
            let spans = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(EnvFilter::new("mcp_replay_guard=info,replay_guard=info"));
            (Some(spans), Some(provider))
        }
        Some(Err(error)) => {
            eprintln!("warning: traces are not exported: {error}");
            (None, None)
        }
        None => (None, None),
    };
    TRACES_EXPORTED.store(traces.is_some(), std::sync::atomic::Ordering::Relaxed);
    if let Some(provider) = provider {
        let _ = PROVIDER.set(provider);
    }
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(calls)
        .with(traces)
        .try_init();
    Telemetry
}

/// The OTLP/HTTP exporter of `endpoint` (the collector's base URL: `/v1/traces` is added, as
/// the specification says for the generic variable), batching spans on its own thread.
fn tracer_provider(endpoint: &str) -> Result<SdkTracerProvider, String> {
    use opentelemetry_otlp::WithExportConfig;
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url)
        .build()
        .map_err(|error| format!("the OTLP exporter cannot start: {error}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("replay-guard")
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// Installs the recorder of the library's metrics for `/metrics` (once per process).
pub(crate) fn metrics() -> anyhow::Result<PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    let recorder = PrometheusBuilder::new()
        .set_buckets(&SECONDS_BUCKETS)
        .map_err(|error| anyhow::anyhow!("the metrics buckets: {error}"))?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|error| anyhow::anyhow!("a metrics recorder is already installed: {error}"))?;
    Ok(HANDLE.get_or_init(|| handle).clone())
}
