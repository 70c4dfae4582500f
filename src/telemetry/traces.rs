//! OpenTelemetry traces: the node's `tracing` spans exported over OTLP/HTTP
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set, and nothing of it installed when neither is: no layer, no
//! exporter, no thread. The W3C trace context crosses the two places where a
//! purchase leaves this process: the request (`traceparent` from nginx or the
//! client) and the order stream (the admission's `traceparent` in its entry,
//! linked from the consumer batch that writes it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::HeaderMap;
use anyhow::Context as _;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithHttpConfig, OTEL_EXPORTER_OTLP_TIMEOUT_DEFAULT};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::resource::{EnvResourceDetector, TelemetryResourceDetector};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::{field, Span, Subscriber};
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt};
use tracing_subscriber::registry::LookupSpan;

/// Either variable turns the export on; the exporter reads them itself.
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// How long one export may take, as the OTLP variables set it.
const TIMEOUT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
];

/// The service name when `OTEL_SERVICE_NAME` (or `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES`) does not give one.
const SERVICE_NAME: &str = "hmdp";

/// The W3C trace context header, and the order stream entry's field.
pub const TRACEPARENT: &str = "traceparent";

/// Whether spans are exported: what the request path asks before it does
/// any work for a trace context.
static EXPORTING: AtomicBool = AtomicBool::new(false);

fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The trace export, when an OTLP endpoint is set; [`Traces::shutdown`]
/// exports the spans still held before the binary ends.
#[must_use = "shut down at exit, or the spans of the last requests are lost"]
pub struct Traces {
    provider: Option<SdkTracerProvider>,
}

impl Traces {
    /// No export.
    pub(super) fn off() -> Traces {
        Traces { provider: None }
    }

    /// The exporter the OTLP variables ask for, `node_id` in its resource as
    /// `service.instance.id`; off when no endpoint is set. Exports from the
    /// batch span processor's thread, its requests sent on the current
    /// Tokio runtime.
    pub(super) fn from_env(node_id: Option<String>) -> anyhow::Result<Traces> {
        let endpoint_set = ENDPOINT_VARIABLES
            .iter()
            .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
        if !endpoint_set {
            return Ok(Traces::off());
        }
        let runtime =
            tokio::runtime::Handle::try_current().context("trace export needs a Tokio runtime")?;
        let client = OnRuntime {
            client: Arc::new(HyperClient::with_default_connector(export_timeout(), None)),
            runtime,
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .build()
            .context("the OTLP trace exporter")?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource(node_id))
            .build();
        Ok(Traces {
            provider: Some(provider),
        })
    }

    /// The `tracing` layer that exports spans, if exporting; from here on
    /// the request path propagates trace contexts.
    pub(super) fn layer<S>(&self) -> Option<OpenTelemetryLayer<S, SdkTracer>>
    where
        S: Subscriber + for<'span> LookupSpan<'span>,
    {
        let tracer = self.provider.as_ref()?.tracer(env!("CARGO_PKG_NAME"));
        EXPORTING.store(true, Ordering::Relaxed);
        Some(tracing_opentelemetry::layer().with_tracer(tracer))
    }

    /// Exports the spans still held and stops the exporter (a no-op when
    /// off).
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        // Blocks until the processor's thread has exported, and that export
        // runs on this runtime: off its worker threads.
        let stopped = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        match stopped {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(error = %error, "trace export not flushed"),
            Err(failed) => tracing::warn!(error = %failed, "trace export not flushed"),
        }
    }
}

/// `service.name` `hmdp` and `service.instance.id` the node id, unless
/// `OTEL_RESOURCE_ATTRIBUTES` or `OTEL_SERVICE_NAME` say otherwise.
fn resource(node_id: Option<String>) -> Resource {
    let instance = node_id.map(|id| KeyValue::new("service.instance.id", id));
    let mut builder = Resource::builder_empty()
        .with_service_name(SERVICE_NAME)
        .with_attributes(instance)
        .with_detectors(&[
            Box::new(TelemetryResourceDetector),
            Box::new(EnvResourceDetector::new()),
        ]);
    if let Some(name) = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.is_empty())
    {
        builder = builder.with_service_name(name);
    }
    builder.build()
}

/// What the OTLP timeout variables say, in milliseconds, or the OTLP
/// default.
fn export_timeout() -> Duration {
    TIMEOUT_VARIABLES
        .iter()
        .find_map(|name| std::env::var(name).ok()?.parse().ok())
        .map(Duration::from_millis)
        .unwrap_or(OTEL_EXPORTER_OTLP_TIMEOUT_DEFAULT)
}

/// The exporter's HTTP client, its requests sent on a Tokio runtime: the
/// batch span processor exports from a thread of its own, outside any
/// runtime, where hyper cannot connect — and a blocking client would bring
/// a runtime of its own.
#[derive(Debug)]
struct OnRuntime {
    client: Arc<HyperClient>,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        (self.runtime)
            .spawn(async move { client.send_bytes(request).await })
            .await?
    }
}

/// When spans are exported: continues the caller's trace in `span`, a
/// request's root, if the request carries a valid W3C `traceparent`, and
/// records the trace's id in its `trace_id` field, so that the request's log
/// lines lead to its trace.
pub fn join_trace(span: &Span, headers: &HeaderMap) {
    if !exporting() {
        return;
    }
    let remote = TraceContextPropagator::new().extract(&RequestHeaders(headers));
    if remote.span().span_context().is_valid() {
        // Fails only for a span the filter disabled: it has no trace.
        let _ = span.set_parent(remote);
    }
    let trace_id = span.context().span().span_context().trace_id();
    span.record("trace_id", field::display(trace_id));
}

/// The current span's trace context as a W3C `traceparent`, when spans are
/// exported: what an order stream entry carries from its admission to its
/// consumer.
pub fn traceparent() -> Option<String> {
    if !exporting() {
        return None;
    }
    let mut carrier = TraceParent(None);
    TraceContextPropagator::new().inject_context(&Span::current().context(), &mut carrier);
    carrier.0
}

/// Starts `span` as the root of a trace of its own, whatever span encloses
/// it in the logs: work that serves many traces (a consumer's batch)
/// belongs to none of them.
pub fn start_trace(span: &Span) {
    if exporting() {
        // Fails only for a span the filter disabled: it has no trace.
        let _ = span.set_parent(Context::new());
    }
}

/// Links `span` to each span whose W3C `traceparent` is one of
/// `traceparents` (read only when spans are exported); a value that does
/// not parse links nothing.
pub fn link<'a>(span: &Span, traceparents: impl IntoIterator<Item = &'a str>) {
    if !exporting() {
        return;
    }
    let propagator = TraceContextPropagator::new();
    for traceparent in traceparents {
        let remote = propagator.extract(&CarriedTraceParent(traceparent));
        let linked = remote.span().span_context().clone();
        if linked.is_valid() {
            span.add_link(linked);
        }
    }
}

/// A request's headers, as a propagator reads them.
struct RequestHeaders<'a>(&'a HeaderMap);

impl Extractor for RequestHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

/// The `traceparent` a propagator writes.
struct TraceParent(Option<String>);

impl Injector for TraceParent {
    fn set(&mut self, key: &str, value: String) {
        if key == TRACEPARENT {
            self.0 = Some(value);
        }
    }
}

/// A `traceparent` carried by something else than a request, for a
/// propagator to read.
struct CarriedTraceParent<'a>(&'a str);

impl Extractor for CarriedTraceParent<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == TRACEPARENT).then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}
