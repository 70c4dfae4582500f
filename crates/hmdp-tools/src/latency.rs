//! Latency percentiles: what the load test and the benchmarks report of a
//! histogram of microseconds.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency percentiles in milliseconds. As JSON (the load test's
/// `latency_ms`) the fields are `p50`, `p90`, `p99` and `max`; the
/// benchmarks copy theirs into fields of their own results (`p50_ms`, ...).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    #[serde(rename = "p50")]
    pub p50_ms: f64,
    #[serde(rename = "p90")]
    pub p90_ms: f64,
    #[serde(rename = "p99")]
    pub p99_ms: f64,
    #[serde(rename = "max")]
    pub max_ms: f64,
}

impl Latency {
    /// The percentiles of `histogram`, which holds microseconds.
    pub fn of(histogram: &Histogram<u64>) -> Latency {
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            p50_ms: ms(histogram.value_at_quantile(0.50)),
            p90_ms: ms(histogram.value_at_quantile(0.90)),
            p99_ms: ms(histogram.value_at_quantile(0.99)),
            max_ms: ms(histogram.max()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_under_the_names_the_scripts_read() {
        let latency = Latency {
            p50_ms: 1.0,
            p90_ms: 2.0,
            p99_ms: 3.0,
            max_ms: 4.0,
        };
        assert_eq!(
            serde_json::to_value(latency).unwrap(),
            serde_json::json!({ "p50": 1.0, "p90": 2.0, "p99": 3.0, "max": 4.0 })
        );
    }
}
