//! `hostcycle_webhook_*` metrics, served on `/metrics` of the webhook's HTTPS port.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    /// CREATE, UPDATE, ... or `none` for a body that was not a review.
    pub operation: String,
    /// [`crate::Outcome::as_str`], or `bad_request` for a body that was not a review.
    pub outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `ok` or `error` (the previous certificate stays in use).
    pub result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClosedLabels {
    /// `refused` (every slot serving a request), `evicted` (closed to make room for a new
    /// one) or `no_request` (no complete request header within the pre-request limit).
    pub reason: String,
}

#[derive(Debug, Clone, Default)]
pub struct WebhookMetrics {
    pub reviews: Family<ReviewLabels, Counter>,
    pub certificate_reloads: Family<ReloadLabels, Counter>,
    pub open_connections: Gauge,
    pub connections_closed: Family<ClosedLabels, Counter>,
}

impl WebhookMetrics {
    /// Registers every metric in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = WebhookMetrics::default();
        registry.register(
            "hostcycle_webhook_reviews",
            "Admission reviews answered, by operation and outcome",
            metrics.reviews.clone(),
        );
        registry.register(
            "hostcycle_webhook_certificate_reloads",
            "Serving certificate reloads after the files changed, by result",
            metrics.certificate_reloads.clone(),
        );
        registry.register(
            "hostcycle_webhook_open_connections",
            "Connections open on the review port",
            metrics.open_connections.clone(),
        );
        registry.register(
            "hostcycle_webhook_connections_closed",
            "Review port connections closed by the webhook to protect itself, by reason",
            metrics.connections_closed.clone(),
        );
        metrics
    }

    pub fn closed(&self, reason: &str) {
        self.connections_closed
            .get_or_create(&ClosedLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn review(&self, operation: &str, outcome: &str) {
        self.reviews
            .get_or_create(&ReviewLabels {
                operation: operation.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn reload(&self, ok: bool) {
        self.certificate_reloads
            .get_or_create(&ReloadLabels {
                result: if ok { "ok" } else { "error" }.to_string(),
            })
            .inc();
    }
}
