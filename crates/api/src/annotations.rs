//! Annotation keys understood by the controller, and the reboot-request parser.
//!
//! Parsing never fails and never panics: an unusable value still counts as a (soft)
//! request, and is reported through [`RebootRequest::invalid`] so the controller can emit
//! an `InvalidRebootAnnotation` Warning event.

use std::collections::BTreeMap;
use std::fmt;

use crate::host::PowerOffMode;

/// Present (any value): the controller leaves the host entirely alone, status included.
pub const PAUSED_ANNOTATION: &str = "baremetalhost.metal3.io/paused";
/// Present (any value): power is not managed; reboot annotations are left in place.
pub const DETACHED_ANNOTATION: &str = "baremetalhost.metal3.io/detached";
/// Suffixless reboot request: power cycle, removed by the controller once the host is off.
pub const REBOOT_ANNOTATION: &str = "reboot.metal3.io";
/// Prefix of keyed reboot requests `reboot.metal3.io/{key}`: hold off until the owner removes it.
pub const REBOOT_ANNOTATION_PREFIX: &str = "reboot.metal3.io/";

/// Which form of reboot annotation a key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebootAnnotationKind<'a> {
    /// `reboot.metal3.io`
    Suffixless,
    /// `reboot.metal3.io/{key}`; the key may be empty or contain further slashes (neither
    /// is a valid Kubernetes annotation key, but we never trust that).
    Keyed(&'a str),
}

/// Classifies an annotation key; `None` when it is not a reboot annotation.
///
/// Matching is exact and case-sensitive: `reboot.metal3.ioX` and `xreboot.metal3.io/a` are
/// not reboot annotations.
pub fn classify_reboot_annotation(key: &str) -> Option<RebootAnnotationKind<'_>> {
    if key == REBOOT_ANNOTATION {
        Some(RebootAnnotationKind::Suffixless)
    } else {
        key.strip_prefix(REBOOT_ANNOTATION_PREFIX)
            .map(RebootAnnotationKind::Keyed)
    }
}

/// Why a reboot annotation could not be used as written. The request still counts, as soft
/// (the mode is the only thing we read from the value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvalidRebootValue {
    /// The value is not JSON.
    NotJson,
    /// The value is JSON but neither an object nor `null` (e.g. a bare string or a list).
    NotAnObject,
    /// `mode` is a string other than `soft` / `hard` / `""` (values are case-sensitive; keys
    /// are not).
    UnknownMode(String),
    /// `mode` is neither a string nor `null`.
    ModeNotAString,
    /// `reboot.metal3.io/` with nothing after the slash.
    EmptyKey,
}

impl fmt::Display for InvalidRebootValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotJson => f.write_str("value is not JSON"),
            Self::NotAnObject => f.write_str("value is not a JSON object"),
            Self::UnknownMode(mode) => {
                write!(f, "unknown mode {mode:?} (expected \"soft\" or \"hard\")")
            }
            Self::ModeNotAString => f.write_str("mode is not a string"),
            Self::EmptyKey => f.write_str("annotation key has an empty suffix"),
        }
    }
}

/// The most characters of an unknown mode repeated in messages.
pub const MAX_ECHOED_MODE: usize = 32;

/// The outcome of parsing one annotation value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRebootValue {
    pub mode: PowerOffMode,
    pub invalid: Option<InvalidRebootValue>,
}

/// Parses a reboot annotation value: `{"mode":"hard"|"soft"}`, default soft.
///
/// Read as metal3's baremetal-operator reads it (Go `encoding/json` into
/// `{Mode string; Force bool}`), so clients written for metal3 work unchanged:
///
/// - object keys match case-insensitively (`{"Mode":"hard"}` is hard) and, when a key appears
///   more than once in any casing, the last one wins;
/// - `null`, `{"mode":null}` and `{"mode":""}` are soft requests without a warning (Go leaves
///   the default, or compares `""` with `"hard"`);
/// - `force` and every other key are ignored (see docs/reboot-api.md for `force`).
///
/// Empty (or whitespace-only) is a valid soft request. Anything unusable gives soft plus the
/// reason; unlike metal3 an unknown mode such as `"HARD"` is reported too.
pub fn parse_reboot_value(value: &str) -> ParsedRebootValue {
    let soft = |invalid| ParsedRebootValue {
        mode: PowerOffMode::Soft,
        invalid,
    };
    if value.trim().is_empty() {
        return soft(None);
    }
    let json: serde_json::Value = match serde_json::from_str(value) {
        Ok(json) => json,
        Err(_) => return soft(Some(InvalidRebootValue::NotJson)),
    };
    match json {
        serde_json::Value::Null => return soft(None),
        serde_json::Value::Object(_) => {}
        _ => return soft(Some(InvalidRebootValue::NotAnObject)),
    }
    // Second pass over the same (valid) text, keeping the order of the keys.
    let mode = match serde_json::from_str::<ModeField>(value) {
        Ok(ModeField(mode)) => mode,
        Err(_) => return soft(Some(InvalidRebootValue::NotJson)),
    };
    match mode {
        None | Some(serde_json::Value::Null) => soft(None),
        Some(serde_json::Value::String(mode)) => match mode.as_str() {
            "soft" | "" => soft(None),
            "hard" => ParsedRebootValue {
                mode: PowerOffMode::Hard,
                invalid: None,
            },
            // Clipped, marked with `…`: the value can be 256 KiB and the mode is echoed in an
            // Event and a log.
            other => soft(Some(InvalidRebootValue::UnknownMode(clip_mode(other)))),
        },
        Some(_) => soft(Some(InvalidRebootValue::ModeNotAString)),
    }
}

/// `mode` as echoed: at most [`MAX_ECHOED_MODE`] characters, then `…` if there was more.
fn clip_mode(mode: &str) -> String {
    let mut chars = mode.chars();
    let mut clipped: String = chars.by_ref().take(MAX_ECHOED_MODE).collect();
    if chars.next().is_some() {
        clipped.push('…');
    }
    clipped
}

/// The value of the last key of a JSON object that equals `mode` ignoring ASCII case (Go's
/// case folding of `mode` is exactly that: none of its letters has a non-ASCII fold).
struct ModeField(Option<serde_json::Value>);

impl<'de> serde::Deserialize<'de> for ModeField {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ModeField;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ModeField, A::Error> {
                let mut mode = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key.eq_ignore_ascii_case("mode") {
                        mode = Some(map.next_value::<serde_json::Value>()?);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(ModeField(mode))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// One reboot annotation found on a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebootRequest {
    /// The full annotation key, e.g. `reboot.metal3.io/capbm-requested-power-off`.
    pub annotation: String,
    pub mode: PowerOffMode,
    /// Set when the key or value was unusable as written (the request still counts, as soft).
    pub invalid: Option<InvalidRebootValue>,
}

/// Summary of every reboot annotation on a host.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RebootRequests {
    /// The suffixless `reboot.metal3.io` request, if present.
    pub suffixless: Option<RebootRequest>,
    /// Keyed requests by key (the part after `reboot.metal3.io/`), sorted.
    pub keyed: BTreeMap<String, RebootRequest>,
}

impl RebootRequests {
    /// Collects the reboot requests from a host's annotations. Never fails.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Self {
        let mut requests = Self::default();
        for (annotation, value) in annotations {
            let Some(kind) = classify_reboot_annotation(annotation) else {
                continue;
            };
            let parsed = parse_reboot_value(value);
            let mut request = RebootRequest {
                annotation: annotation.clone(),
                mode: parsed.mode,
                invalid: parsed.invalid,
            };
            match kind {
                RebootAnnotationKind::Suffixless => requests.suffixless = Some(request),
                RebootAnnotationKind::Keyed(key) => {
                    // An empty key cannot be set through the API server; should one appear
                    // anyway it still holds the host off (the safe reading), flagged.
                    if key.is_empty() && request.invalid.is_none() {
                        request.invalid = Some(InvalidRebootValue::EmptyKey);
                    }
                    requests.keyed.insert(key.to_owned(), request);
                }
            }
        }
        requests
    }

    /// No reboot annotation at all.
    pub fn is_empty(&self) -> bool {
        self.suffixless.is_none() && self.keyed.is_empty()
    }

    pub fn has_suffixless(&self) -> bool {
        self.suffixless.is_some()
    }

    pub fn has_keyed(&self) -> bool {
        !self.keyed.is_empty()
    }

    /// Keys of the keyed requests, sorted.
    pub fn keyed_keys(&self) -> Vec<&str> {
        self.keyed.keys().map(String::as_str).collect()
    }

    /// Every request, suffixless first then keyed by key.
    pub fn iter(&self) -> impl Iterator<Item = &RebootRequest> {
        self.suffixless.iter().chain(self.keyed.values())
    }

    /// Full annotation keys of every request, suffixless first then keyed sorted.
    pub fn annotation_keys(&self) -> Vec<String> {
        self.iter().map(|r| r.annotation.clone()).collect()
    }

    /// Hard if any request is hard (workload recovery beats a graceful shutdown), else soft.
    pub fn effective_mode(&self) -> PowerOffMode {
        if self.iter().any(|r| r.mode == PowerOffMode::Hard) {
            PowerOffMode::Hard
        } else {
            PowerOffMode::Soft
        }
    }

    /// Requests whose key or value was unusable, with the reason.
    pub fn invalid(&self) -> Vec<(&str, &InvalidRebootValue)> {
        self.iter()
            .filter_map(|r| r.invalid.as_ref().map(|i| (r.annotation.as_str(), i)))
            .collect()
    }

    /// Drops the suffixless request (after the controller removed the annotation).
    pub fn without_suffixless(&self) -> Self {
        Self {
            suffixless: None,
            keyed: self.keyed.clone(),
        }
    }
}

/// `baremetalhost.metal3.io/paused` is present.
pub fn is_paused(annotations: &BTreeMap<String, String>) -> bool {
    annotations.contains_key(PAUSED_ANNOTATION)
}

/// `baremetalhost.metal3.io/detached` is present.
pub fn is_detached(annotations: &BTreeMap<String, String>) -> bool {
    annotations.contains_key(DETACHED_ANNOTATION)
}
