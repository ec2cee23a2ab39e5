//! `hostcycle_webhook_*` metrics, served on `/metrics` of the webhook's HTTPS port.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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

#[derive(Debug, Clone, Default)]
pub struct WebhookMetrics {
    pub reviews: Family<ReviewLabels, Counter>,
    pub certificate_reloads: Family<ReloadLabels, Counter>,
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
        metrics
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
