//! The Eviction API, posted by hand: kube's `Api::<Pod>::evict` sends delete options under a
//! key the API server ignores (so a dry run would evict for real). The version is chosen by
//! discovery: `policy/v1` where served, else `policy/v1beta1` (Kubernetes 1.20).
//!
//! The client must not retry 429 answers by itself (`crate::client_config`): a 429 here is a
//! PodDisruptionBudget's refusal, which the drain rules act on at once.

use crate::cluster::errors::is_not_found;
use hostcycle_core::queue::drain::EvictionAnswer;
use kube::Client;

use crate::text::bounded;
use serde_json::json;

/// Longest server message kept in an answer.
const MAX_MESSAGE: usize = 512;

/// Posts evictions with the policy version this API server serves.
#[derive(Clone)]
pub struct Evictor {
    client: Client,
    api_version: String,
}

impl Evictor {
    /// Discovers the Eviction version: `policy/v1` if served, else `policy/v1beta1`.
    pub async fn discover(client: Client) -> Result<Evictor, kube::Error> {
        let versions = match kube::discovery::group(&client, "policy").await {
            Ok(group) => group.versions().map(str::to_string).collect::<Vec<_>>(),
            Err(e) if is_not_found(&e) => Vec::new(),
            Err(e) => return Err(e),
        };
        let api_version = if versions.iter().any(|v| v == "v1") {
            "policy/v1"
        } else {
            "policy/v1beta1"
        };
        Ok(Evictor {
            client,
            api_version: api_version.to_string(),
        })
    }

    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// Evicts (or with `dry_run`, asks whether it could evict) one pod.
    pub async fn evict(&self, namespace: &str, name: &str, dry_run: bool) -> EvictionAnswer {
        let mut delete_options = json!({});
        if dry_run {
            delete_options = json!({ "dryRun": ["All"] });
        }
        let body = json!({
            "apiVersion": self.api_version,
            "kind": "Eviction",
            "metadata": { "name": name, "namespace": namespace },
            "deleteOptions": delete_options,
        });
        let url = format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            path_segment(namespace),
            path_segment(name)
        );
        let request = match serde_json::to_vec(&body)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                http::Request::post(url)
                    .header("Content-Type", "application/json")
                    .body(b)
                    .map_err(|e| e.to_string())
            }) {
            Ok(r) => r,
            Err(e) => return EvictionAnswer::Failed(format!("building the eviction request: {e}")),
        };
        match self.client.request_text(request).await {
            Ok(_) => EvictionAnswer::Evicted,
            Err(e) if is_not_found(&e) => EvictionAnswer::NotFound,
            Err(kube::Error::Api(s)) if s.code == 429 => {
                EvictionAnswer::Refused(bounded(&s.message, MAX_MESSAGE))
            }
            Err(e) => EvictionAnswer::Failed(bounded(&e.to_string(), MAX_MESSAGE)),
        }
    }
}

/// Object names are DNS subdomains; anything else is percent-encoded rather than trusted.
fn path_segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(path_segment("demo-7d9f.x"), "demo-7d9f.x");
        assert_eq!(path_segment("a/b"), "a%2Fb");
        assert_eq!(path_segment("a b?"), "a%20b%3F");
    }
}
