//! The pure-CPU parts of a purchase: composing an order id and serializing
//! the responses. They cost nanoseconds against the milliseconds of a Redis
//! round trip and a MySQL commit; these benches keep that claim checked.

use chrono::Utc;
use criterion::{criterion_group, criterion_main, Criterion};
use hmdp::api::response::ApiResult;
use hmdp::id_worker::compose;
use std::hint::black_box;

fn id_worker(c: &mut Criterion) {
    let now = Utc::now();
    c.bench_function("compose order id", |b| {
        b.iter(|| compose(black_box(now), black_box(123_456)))
    });
}

fn responses(c: &mut Criterion) {
    c.bench_function("serialize order id result", |b| {
        b.iter(|| {
            serde_json::to_vec(&ApiResult {
                success: true,
                error_msg: None,
                data: Some(black_box(665_762_232_012_898_305_i64).to_string()),
                total: None,
                error_code: None,
            })
        })
    });
    c.bench_function("serialize sold-out rejection", |b| {
        b.iter(|| {
            serde_json::to_vec(&ApiResult::fail(
                black_box("库存不足！").to_owned(),
                "SOLD_OUT",
            ))
        })
    });
}

criterion_group!(benches, id_worker, responses);
criterion_main!(benches);
