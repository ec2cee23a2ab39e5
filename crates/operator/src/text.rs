//! Text that reaches the API server: API errors in words, bounded (see
//! [`hostcycle_core::text`]).

pub use hostcycle_core::text::bounded;

/// An API error with what was attempted: a refusal by RBAC names the verb, the resource and
/// where, in words ("forbidden: cannot list secrets in all namespaces"), followed by the API
/// server's own message. An answer about Secrets that could not be deserialized is reported
/// without the parser's message: it quotes bytes of the answer and their position (a piece
/// of a value, where keys are).
pub fn api_error(error: &kube::Error, verb: &str, resource: &str, namespace: &str) -> String {
    let scope = if namespace.is_empty() {
        "in all namespaces".to_string()
    } else {
        format!("in namespace {namespace}")
    };
    match error {
        kube::Error::SerdeError(_) if resource == "secrets" => format!(
            "{verb} {resource} {scope}: the API server's answer could not be read (the \
             parser's details are withheld: they may quote the Secret's data); check the API \
             server and any proxy in front of it"
        ),
        kube::Error::Api(status) if status.code == 403 => bounded(
            &format!(
                "forbidden: cannot {verb} {resource} {scope} (grant it with `hostcycle manifests`): {}",
                status.message
            ),
            1024,
        ),
        other => bounded(&format!("{verb} {resource} {scope}: {other}"), 1024),
    }
}

/// A watch error with what was watched (see [`api_error`]).
pub fn watch_error(
    error: &kube::runtime::watcher::Error,
    resource: &str,
    namespace: &str,
) -> String {
    use kube::runtime::watcher::Error as W;
    match error {
        W::InitialListFailed(e) => api_error(e, "list", resource, namespace),
        W::WatchStartFailed(e) => api_error(e, "watch", resource, namespace),
        W::WatchFailed(e) => api_error(e, "watch", resource, namespace),
        other => bounded(&format!("watching {resource}: {other}"), 1024),
    }
}

#[cfg(test)]
mod tests {
    use super::{api_error, bounded};

    #[test]
    fn a_refusal_names_verb_resource_and_namespace() {
        let forbidden = kube::Error::Api(
            kube::core::Status::failure(
                "secrets is forbidden: User \"system:serviceaccount:x:y\" cannot list resource \"secrets\"",
                "Forbidden",
            )
            .with_code(403)
            .boxed(),
        );
        let text = api_error(&forbidden, "list", "secrets", "");
        assert!(
            text.starts_with("forbidden: cannot list secrets in all namespaces"),
            "{text}"
        );
        let text = api_error(&forbidden, "get", "secrets", "ns1");
        assert!(
            text.starts_with("forbidden: cannot get secrets in namespace ns1"),
            "{text}"
        );
    }

    #[test]
    fn an_unreadable_secret_is_reported_without_the_parsers_message() {
        let parsed = serde_json::from_str::<k8s_openapi::api::core::v1::Secret>(
            r#"{"data": {"password": "Hj8-Zv2q!Kc5w"}}"#,
        );
        let error = kube::Error::SerdeError(parsed.expect_err("data that is not base64"));
        let text = api_error(&error, "get", "secrets", "hosts");
        assert!(
            text.starts_with("get secrets in namespace hosts: the API server's answer could not"),
            "{text}"
        );
        for detail in ["symbol", "offset", "column", "Zv2q"] {
            assert!(!text.contains(detail), "{detail:?} in: {text}");
        }
        // Other resources keep the parser's message (it helps and holds no secret).
        let text = api_error(&error, "list", "nodes", "");
        assert!(text.contains("offset"), "{text}");
    }

    #[test]
    fn cuts_on_char_boundaries_within_the_limit() {
        assert_eq!(bounded("short", 10), "short");
        let long = "é".repeat(600);
        let cut = bounded(&long, 1024);
        assert!(cut.len() <= 1024 && cut.ends_with('…'), "{}", cut.len());
        assert_eq!(bounded("abcdef", 4), "a…");
        assert_eq!(bounded("", 0), "");
    }
}
