//! The server's metrics, in the Prometheus text format at `GET /metrics` (`prometheus-client`).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Every metric the server keeps (names are `sinter_…`; counters end in `_total`).
pub struct Metrics {
    registry: Registry,
    /// Requests accepted into the queue.
    pub requests: Counter,
    /// Requests refused (bad input, full queue, shutting down).
    pub rejected: Counter,
    /// Requests stopped because their client went away.
    pub cancelled: Counter,
    /// Prompt tokens prefilled.
    pub prompt_tokens: Counter,
    /// Tokens generated.
    pub generated_tokens: Counter,
    /// Seconds from a request's arrival to its first token.
    pub time_to_first_token: Histogram,
    /// Seconds between consecutive tokens of a request.
    pub inter_token_latency: Histogram,
    /// Requests waiting for admission.
    pub queue_length: Gauge,
    /// Requests decoding.
    pub running: Gauge,
    /// KV cache pages held by running requests.
    pub kv_pages_in_use: Gauge,
    /// KV cache pages in the pool.
    pub kv_pages_total: Gauge,
    /// Tokens per second over the last second of decode steps.
    pub tokens_per_second: Gauge<f64, AtomicU64>,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("sinter");
        let requests = Counter::default();
        let rejected = Counter::default();
        let cancelled = Counter::default();
        let prompt_tokens = Counter::default();
        let generated_tokens = Counter::default();
        let time_to_first_token = Histogram::new(exponential_buckets(0.001, 2.0, 18));
        let inter_token_latency = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let (queue_length, running, kv_pages_in_use, kv_pages_total) = (Gauge::default(), Gauge::default(), Gauge::default(), Gauge::default());
        let tokens_per_second = Gauge::<f64, AtomicU64>::default();
        registry.register("requests", "Requests accepted into the queue", requests.clone());
        registry.register("requests_rejected", "Requests refused (bad input, full queue, shutting down)", rejected.clone());
        registry.register("requests_cancelled", "Requests stopped because their client went away", cancelled.clone());
        registry.register("prompt_tokens", "Prompt tokens prefilled", prompt_tokens.clone());
        registry.register("generated_tokens", "Tokens generated", generated_tokens.clone());
        registry.register("time_to_first_token_seconds", "Seconds from a request's arrival to its first token", time_to_first_token.clone());
        registry.register("inter_token_latency_seconds", "Seconds between consecutive tokens of a request", inter_token_latency.clone());
        registry.register("queue_length", "Requests waiting for admission", queue_length.clone());
        registry.register("running_requests", "Requests decoding", running.clone());
        registry.register("kv_pages_in_use", "KV cache pages held by running requests", kv_pages_in_use.clone());
        registry.register("kv_pages_total", "KV cache pages in the pool", kv_pages_total.clone());
        registry.register("tokens_per_second", "Tokens generated per second over the last second", tokens_per_second.clone());
        Metrics { registry, requests, rejected, cancelled, prompt_tokens, generated_tokens, time_to_first_token, inter_token_latency, queue_length, running, kv_pages_in_use, kv_pages_total, tokens_per_second }
    }

    /// The metrics in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}
