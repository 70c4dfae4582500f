//! Traces: a node started with an OTLP endpoint exports its spans to an
//! OTLP/HTTP receiver the test runs. A synchronous purchase is one trace,
//! from the request (continuing the caller's `traceparent`) through the
//! lock, the transaction and the release, exported at the latest when the
//! node stops; a stream order's consumer batch is a trace of its own,
//! linked to the admission that wrote the order's entry.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use hmdp_test_support::{phone, wait_for};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use crate::helpers::{buy_at, buy_with_headers, spawn_app, NodeProcess};

/// The exported name of a purchase's request span.
const PURCHASE_REQUEST: &str = "POST /voucher-order/seckill/{voucherId}";

/// What the receiver got: every span, with its node's resource attributes.
#[derive(Default)]
struct Received {
    spans: Vec<(Span, Vec<KeyValue>)>,
    /// Bodies it could not decode, which fail the test.
    undecoded: Vec<String>,
}

/// An OTLP/HTTP trace receiver on 127.0.0.1: `POST /v1/traces`, protobuf or
/// JSON as the content type says.
struct Receiver {
    address: String,
    received: Arc<Mutex<Received>>,
    server: ServerHandle,
}

impl Receiver {
    fn start() -> Receiver {
        let received = Arc::new(Mutex::new(Received::default()));
        let state = web::Data::from(received.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .app_data(web::PayloadConfig::new(16 << 20))
                .route("/v1/traces", web::post().to(receive))
        })
        .workers(1)
        .bind("127.0.0.1:0")
        .expect("a port for the receiver");
        let address = format!("http://{}", server.addrs()[0]);
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        Receiver {
            address,
            received,
            server: handle,
        }
    }

    /// The node's environment that exports to this receiver in `protocol`
    /// (`http/protobuf`, `http/json`), a batch at least every `delay_ms`.
    fn env<'a>(&'a self, protocol: &'a str, delay_ms: &'a str) -> [(&'a str, &'a str); 3] {
        [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.address.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_BSP_SCHEDULE_DELAY", delay_ms),
        ]
    }

    /// Every span received so far.
    fn spans(&self) -> Spans {
        let received = self.received.lock().unwrap();
        assert!(
            received.undecoded.is_empty(),
            "undecodable exports: {:?}",
            received.undecoded
        );
        Spans(received.spans.clone())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // Not awaited: stopping is all that is asked of it.
        drop(self.server.stop(false));
    }
}

async fn receive(
    request: HttpRequest,
    body: web::Bytes,
    received: web::Data<Mutex<Received>>,
) -> HttpResponse {
    let json = (request.headers().get("content-type"))
        .is_some_and(|kind| kind.as_bytes().starts_with(b"application/json"));
    let export = match json {
        true => {
            serde_json::from_slice::<ExportTraceServiceRequest>(&body).map_err(|e| e.to_string())
        }
        false => ExportTraceServiceRequest::decode(body).map_err(|e| e.to_string()),
    };
    let mut received = received.lock().unwrap();
    match export {
        Ok(export) => {
            for resource_spans in export.resource_spans {
                let resource = resource_spans.resource.unwrap_or_default().attributes;
                for scope_spans in resource_spans.scope_spans {
                    for span in scope_spans.spans {
                        received.spans.push((span, resource.clone()));
                    }
                }
            }
        }
        Err(error) => received.undecoded.push(error),
    }
    match json {
        true => HttpResponse::Ok()
            .content_type("application/json")
            .body("{}"),
        false => HttpResponse::Ok()
            .content_type("application/x-protobuf")
            .finish(),
    }
}

/// Spans as received, each with its node's resource attributes.
struct Spans(Vec<(Span, Vec<KeyValue>)>);

impl Spans {
    /// The spans named `name`.
    fn named(&self, name: &'static str) -> impl Iterator<Item = &Span> + '_ {
        self.0
            .iter()
            .map(|(span, _)| span)
            .filter(move |span| span.name == name)
    }

    /// The one span named `name` in the trace `trace_id`.
    fn only(&self, trace_id: &[u8], name: &'static str) -> &Span {
        let mut found = self.named(name).filter(|span| span.trace_id == trace_id);
        let span = found.next().unwrap_or_else(|| panic!("no span {name}"));
        assert!(found.next().is_none(), "more than one span {name}");
        span
    }

    /// The span with the id `span_id`.
    fn by_id(&self, span_id: &[u8]) -> Option<&Span> {
        (self.0.iter().map(|(span, _)| span)).find(|span| span.span_id == span_id)
    }

    /// The names from the first of `span`'s ancestors this node exported
    /// (the trace's root, or the one whose parent is the caller's) down to
    /// it.
    fn path(&self, span: &Span) -> Vec<String> {
        let mut path = vec![span.name.clone()];
        let mut parent = self.by_id(&span.parent_span_id);
        while let Some(up) = parent {
            assert_eq!(up.trace_id, span.trace_id, "a parent in another trace");
            path.push(up.name.clone());
            parent = self.by_id(&up.parent_span_id);
        }
        path.reverse();
        path
    }

    /// The resource attribute `key` of the node that sent `span`.
    fn resource(&self, span: &Span, key: &str) -> String {
        let (_, resource) = (self.0.iter())
            .find(|(other, _)| other.span_id == span.span_id)
            .expect("a span received");
        let value = resource.iter().find(|attribute| attribute.key == key);
        text(value.and_then(|attribute| attribute.value.as_ref()?.value.as_ref()))
    }

    /// The tree of the trace whose root is `root`, one span a line with its
    /// attributes of interest and its links.
    fn tree(&self, root: &Span) -> String {
        let mut out = format!("trace {}\n", hex(&root.trace_id));
        self.write_tree(&mut out, root, 1);
        out
    }

    fn write_tree(&self, out: &mut String, span: &Span, depth: usize) {
        let shown: Vec<String> = (span.attributes.iter())
            .filter(|attribute| SHOWN.contains(&attribute.key.as_str()))
            .map(|attribute| {
                let value = attribute.value.as_ref().and_then(|v| v.value.as_ref());
                format!("{}={}", attribute.key, text(value))
            })
            .collect();
        let _ = write!(out, "{}{}", "  ".repeat(depth), span.name);
        if !shown.is_empty() {
            let _ = write!(out, " {{{}}}", shown.join(" "));
        }
        let _ = write!(out, " span {}", hex(&span.span_id));
        if !span.parent_span_id.is_empty() && self.by_id(&span.parent_span_id).is_none() {
            let _ = write!(
                out,
                " (parent: the caller's span {})",
                hex(&span.parent_span_id)
            );
        }
        for link in &span.links {
            let linked = self
                .by_id(&link.span_id)
                .map_or("?", |span| span.name.as_str());
            let _ = write!(
                out,
                " -> link to {linked} (trace {} span {})",
                hex(&link.trace_id),
                hex(&link.span_id)
            );
        }
        out.push('\n');
        let mut children: Vec<&Span> = (self.0.iter().map(|(span, _)| span))
            .filter(|child| child.parent_span_id == span.span_id)
            .collect();
        children.sort_by_key(|child| child.start_time_unix_nano);
        for child in children {
            self.write_tree(out, child, depth + 1);
        }
    }
}

/// The attributes a printed tree shows.
const SHOWN: &[&str] = &["user_id", "voucher_id", "order_id", "orders", "entries"];

/// An attribute's value as text.
fn text(value: Option<&any_value::Value>) -> String {
    match value {
        Some(any_value::Value::StringValue(text)) => text.clone(),
        Some(any_value::Value::IntValue(number)) => number.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> String {
    let value = span
        .attributes
        .iter()
        .find(|attribute| attribute.key == key);
    text(value.and_then(|attribute| attribute.value.as_ref()?.value.as_ref()))
}

/// A purchase of `voucher` by `token`'s user at `address`, sent with the
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_a_purchase_from_its_request_through_the_lock_to_the_release() {
    let receiver = Receiver::start();
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(1)).await;
    // No batch is due for ten minutes: the spans reach the receiver only
    // through the flush of a node that stops.
    let env = receiver.env("http/protobuf", "600000");
    let mut node = NodeProcess::start_with_env(&app, &[], &env).await;

    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{caller_trace}-{caller_span}-01");
    let answer = buy_with_headers(
        &node.address,
        voucher,
        &token,
        &[("traceparent", &traceparent)],
    )
    .await;
    assert_eq!(answer["success"], true, "{answer}");
    let order_id = answer["data"].as_str().expect("an order id").to_owned();
    node.terminate().expect("SIGTERM sent");
    let status = node.wait_exit(Duration::from_secs(30)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "exit status {status:?}"
    );

    let spans = receiver.spans();
    let request = spans
        .named(PURCHASE_REQUEST)
        .next()
        .expect("the purchase's request exported when the node stopped");
    println!("{}", spans.tree(request));
    assert_eq!(hex(&request.trace_id), caller_trace, "the caller's trace");
    assert_eq!(
        hex(&request.parent_span_id),
        caller_span,
        "the caller's span"
    );
    let trace = request.trace_id.clone();
    let (acquire, transaction, commit, release) = (
        spans.only(&trace, "lock_acquire"),
        spans.only(&trace, "order_transaction"),
        spans.only(&trace, "commit"),
        spans.only(&trace, "lock_release"),
    );
    assert_eq!(
        spans.path(acquire),
        [PURCHASE_REQUEST, "purchase", "lock_acquire"]
    );
    assert_eq!(
        spans.path(commit),
        [
            PURCHASE_REQUEST,
            "purchase",
            "shared_commit",
            "order_transaction",
            "commit"
        ]
    );
    assert_eq!(
        spans.path(release),
        [PURCHASE_REQUEST, "purchase", "lock_release"]
    );
    assert_eq!(attribute(transaction, "order_id"), order_id);
    // Taken, written under it, released after the commit.
    assert!(acquire.end_time_unix_nano <= transaction.start_time_unix_nano);
    assert!(commit.end_time_unix_nano <= release.start_time_unix_nano);
    assert_eq!(spans.resource(request, "service.name"), "hmdp");
    let instance = spans.resource(request, "service.instance.id");
    assert!(
        instance.ends_with(&format!(":{}", node.port())),
        "service.instance.id {instance}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_orders_batch_links_to_its_admission() {
    let receiver = Receiver::start();
    let app = spawn_app(|_| {}).await;
    let voucher = app.create_open_seckill(10).await;
    let token = app.login(&phone(1)).await;
    let env = receiver.env("http/json", "100");
    let node = NodeProcess::start_with_env(&app, &["--seckill=stream"], &env).await;

    let answer = buy_at(&node.address, voucher, &token).await;
    assert_eq!(answer["success"], true, "{answer}");
    let order_id = answer["data"].as_str().expect("an order id").to_owned();
    // Both traces end with their roots: the request's once answered, the
    // batch's once its order is written and acknowledged.
    let spans = wait_for(
        "the purchase's and the batch's traces",
        Duration::from_secs(30),
        || async {
            let spans = receiver.spans();
            let ended = |name| spans.named(name).next().is_some();
            (ended(PURCHASE_REQUEST) && ended("stream_batch")).then_some(spans)
        },
    )
    .await;
    let request = spans.named(PURCHASE_REQUEST).next().unwrap();
    let batch = spans.named("stream_batch").next().unwrap();
    println!("{}", spans.tree(request));
    println!("{}", spans.tree(batch));

    let admission = spans.only(&request.trace_id, "admission");
    assert_eq!(
        spans.path(admission),
        [PURCHASE_REQUEST, "purchase", "admission"]
    );
    assert!(batch.parent_span_id.is_empty(), "a batch is a trace's root");
    assert_ne!(batch.trace_id, request.trace_id);
    let links: Vec<(&[u8], &[u8])> = (batch.links.iter())
        .map(|link| (link.trace_id.as_slice(), link.span_id.as_slice()))
        .collect();
    assert_eq!(
        links,
        [(admission.trace_id.as_slice(), admission.span_id.as_slice())]
    );
    let trace = batch.trace_id.clone();
    let commit = spans.only(&trace, "commit");
    assert_eq!(
        spans.path(commit),
        ["stream_batch", "order_transaction", "commit"]
    );
    for lock in ["lock_acquire", "lock_release"] {
        assert_eq!(spans.path(spans.only(&trace, lock)), ["stream_batch", lock]);
    }
    let transaction = spans.only(&trace, "order_transaction");
    assert_eq!(attribute(transaction, "order_id"), order_id);
}
