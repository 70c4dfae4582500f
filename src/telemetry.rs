//! Log set-up: `tracing` to stderr, filtered by `RUST_LOG` (default `info`),
//! as text for a person at a terminal or as JSON lines for a collector
//! (`--log-format`); the same spans exported as OpenTelemetry traces when an
//! OTLP endpoint is set ([`traces`]); and the request span that carries
//! nginx's `X-Request-Id` (and the caller's trace context).

pub mod traces;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use tracing::Span;
use tracing_actix_web::{DefaultRootSpanBuilder, RootSpanBuilder};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use traces::Traces;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line per event, its spans' fields in front.
    #[default]
    Text,
    /// One JSON object per line: the event's fields at the top level, the
    /// span it happened in (`span`) and every enclosing one (`spans`), so
    /// that the request id, the user, the voucher and the order of a
    /// purchase are fields of each of its lines.
    Json,
}

/// How a binary logs: its `--log-format` flag, shared by `hmdp-server` and
/// `hmdp`.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct LogSettings {
    /// Log lines as `text` (for a person at a terminal) or `json` (one
    /// object per line, for a collector).
    #[arg(
        long,
        global = true,
        env = "HMDP_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    pub log_format: LogFormat,
}

impl LogSettings {
    /// Logs in the format asked for, filtered by `RUST_LOG`, or `default`
    /// when it is not set; and, when an OTLP endpoint is set, exports the
    /// spans the filter lets through, the resource naming the node
    /// `node_id`. Called on a Tokio runtime, which sends the exports.
    pub fn init(self, default: &str, node_id: Option<String>) -> Traces {
        let (traces, refused) = match Traces::from_env(node_id) {
            Ok(traces) => (traces, None),
            Err(error) => (Traces::off(), Some(error)),
        };
        init_with_default(default, self.log_format, &traces);
        if let Some(error) = refused {
            tracing::error!(error = format!("{error:#}"), "traces not exported");
        }
        traces
    }
}

/// Text logs at `info` unless `RUST_LOG` says otherwise; no traces.
pub fn init() {
    init_with_default("info", LogFormat::Text, &Traces::off());
}

/// Logs in `format`, filtered by `RUST_LOG`, or `default` when it is not
/// set, and the spans `traces` exports, if any, under the same filter.
fn init_with_default(default: &str, format: LogFormat, traces: &Traces) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Text => logs.boxed(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .boxed(),
    };
    // A second initialisation (tests) is harmless: keep the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(traces.layer())
        .with(filter)
        .try_init();
}

/// The request's root span, with `x_request_id` taken from the `X-Request-Id`
/// header nginx sets (so one id follows a request across proxy and node), or
/// tracing-actix-web's generated `request_id` when the header is absent.
pub struct RequestIdSpan;

impl RootSpanBuilder for RequestIdSpan {
    fn on_request_start(request: &ServiceRequest) -> Span {
        let forwarded = request
            .headers()
            .get("x-request-id")
            .and_then(|value| value.to_str().ok())
            .filter(|id| id.len() <= 128)
            .unwrap_or("")
            .to_owned();
        let span = tracing_actix_web::root_span!(request, x_request_id = %forwarded);
        traces::join_trace(&span, request.headers());
        span
    }

    /// Marks the span failed only when the node failed (5xx): a business
    /// "no" is a 200 that carries an error, and a 4xx is the client's doing.
    fn on_request_end<B: MessageBody>(
        span: Span,
        outcome: &Result<ServiceResponse<B>, actix_web::Error>,
    ) {
        match outcome {
            Ok(response) if !response.status().is_server_error() => {
                span.record("http.status_code", response.status().as_u16());
                span.record("otel.status_code", "OK");
            }
            _ => DefaultRootSpanBuilder::on_request_end(span, outcome),
        }
    }
}
