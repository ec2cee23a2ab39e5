//! What an API server's error answer means, by status: the one place the operator, its
//! controllers and the CLI read 404 and 409 answers.

/// Whether the API server answered 409: a failed precondition (resourceVersion or uid) or an
/// object that already exists. Either way someone else wrote first.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Whether the API server answered 409 AlreadyExists (a create found the name taken).
pub fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_already_exists())
}

/// Whether the API server answered 404: the object, or its resource type, does not exist.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether the API server answered 404 for an object, not for a resource type it does not
/// serve (such as a CRD that is not installed).
pub fn is_object_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404 && !is_missing_resource_type(&s.message))
}

/// Whether a 404's message says the resource type itself is not served.
pub fn is_missing_resource_type(message: &str) -> bool {
    message.contains("could not find the requested resource")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, reason)
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn statuses_are_read_by_code() {
        assert!(is_conflict(&answer(409, "Conflict", "")));
        assert!(is_conflict(&answer(409, "AlreadyExists", "")));
        assert!(is_already_exists(&answer(409, "AlreadyExists", "")));
        assert!(!is_already_exists(&answer(409, "Conflict", "")));
        assert!(is_not_found(&answer(404, "NotFound", "")));
        assert!(!is_not_found(&answer(409, "Conflict", "")));
    }

    #[test]
    fn a_missing_resource_type_is_not_a_missing_object() {
        let missing_type = answer(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        assert!(is_not_found(&missing_type));
        assert!(!is_object_not_found(&missing_type));
        assert!(is_object_not_found(&answer(
            404,
            "NotFound",
            "hosts \"a\" not found"
        )));
    }
}
