//! The webhook's one decision, pure: an admission request in, allowed or denied with a
//! message out.
//!
//! - **Values** (always): a reboot annotation (`reboot.metal3.io` or `reboot.metal3.io/{key}`)
//!   that is added, or whose value changes, must hold a value the controller and metal3 both
//!   accept ([`crate::values`]). A value that was already there and is left as it was is let
//!   through with a warning, so an object carrying one from before the webhook can still be
//!   edited (the operator's own annotation removals included).
//! - **Who** (with an allow-list): adding, removing or changing a reboot annotation, and
//!   setting `spec.online` to false (an update from true, or a create with false), are
//!   allowed only to listed identities; so are changing `spec.bmc` (`address`,
//!   `credentialsName`, `disableCertificateVerification`) of an existing host, adding,
//!   removing or changing metal3's `paused` and `detached` annotations (a create with one
//!   counts as adding it), and adding, changing (`apiVersion`, `kind`, `namespace`, `name`)
//!   or removing `spec.consumerRef` of an existing host — which Machine the host belongs to,
//!   so which node's remediation fences it. Setting `spec.bmc` on a create is restricted only
//!   with [`Policy::restrict_bmc_on_create`], setting `spec.consumerRef` on a create only with
//!   [`Policy::restrict_consumer_ref_on_create`]. Other edits of a host are not restricted.
//!
//! Only CREATE and UPDATE of `baremetalhosts.metal3.io` are looked at; anything else sent to
//! the webhook is allowed.

use std::collections::BTreeMap;

use hostcycle_api::{
    DETACHED_ANNOTATION, PAUSED_ANNOTATION, RebootAnnotationKind, classify_reboot_annotation,
};
use serde_json::Value;

use crate::policy::Policy;
use crate::review::{AdmissionRequest, AdmissionResponse, Operation, ParsedReview, Status};
use crate::values::{ACCEPTED_VALUES, check_reboot_value};

pub const HOST_GROUP: &str = "metal3.io";
pub const HOST_RESOURCE: &str = "baremetalhosts";

/// Changes listed in one denial before "and N more".
const MAX_LISTED: usize = 6;

/// How a review ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A host's create or update that passed every check.
    Allowed,
    /// Not a host's create or update: allowed without a look.
    NotChecked,
    /// A reboot annotation value was refused (HTTP 400 in the status).
    InvalidValue,
    /// A restricted change by an identity not on the allow-list (HTTP 403).
    Unauthorized,
    /// The review lacked what the operation needs (no object), or its objects are not
    /// shaped like BareMetalHosts: refused, HTTP 400.
    Malformed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::NotChecked => "not_checked",
            Self::InvalidValue => "invalid_value",
            Self::Unauthorized => "unauthorized",
            Self::Malformed => "malformed",
        }
    }

    pub fn allowed(self) -> bool {
        matches!(self, Self::Allowed | Self::NotChecked)
    }
}

/// The decision and what the client is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub outcome: Outcome,
    /// Why it was refused (empty when allowed).
    pub message: String,
    /// Shown to the client even when allowed (`kubectl` prints them).
    pub warnings: Vec<String>,
    /// The power requests the change makes (for the log).
    pub changes: Vec<PowerChange>,
    /// Who the allow-list lets make a refused change: for the webhook's log only, never
    /// for the client (any host editor reads a denial). Empty when none was refused.
    pub allowed_identities: String,
}

impl Verdict {
    fn allowed(outcome: Outcome, warnings: Vec<String>, changes: Vec<PowerChange>) -> Self {
        Verdict {
            outcome,
            message: String::new(),
            warnings,
            changes,
            allowed_identities: String::new(),
        }
    }

    fn malformed(message: String) -> Self {
        Verdict {
            outcome: Outcome::Malformed,
            message,
            warnings: Vec::new(),
            changes: Vec::new(),
            allowed_identities: String::new(),
        }
    }

    pub fn is_allowed(&self) -> bool {
        self.outcome.allowed()
    }

    /// The `response` of the answering review.
    pub fn response(&self, uid: &str) -> AdmissionResponse {
        let status = match self.outcome {
            Outcome::Allowed | Outcome::NotChecked => None,
            Outcome::Unauthorized => Some(Status {
                status: "Failure",
                code: 403,
                reason: "Forbidden",
                message: self.message.clone(),
            }),
            Outcome::InvalidValue | Outcome::Malformed => Some(Status {
                status: "Failure",
                code: 400,
                reason: "BadRequest",
                message: self.message.clone(),
            }),
        };
        AdmissionResponse {
            uid: uid.to_string(),
            allowed: self.is_allowed(),
            status,
            warnings: self.warnings.clone(),
        }
    }
}

/// A change the allow-list restricts: a power request (a reboot annotation, `spec.online`
/// to false), a change of what controls the host's power (its BMC, metal3's `paused` and
/// `detached` annotations), or of whom the host belongs to (`spec.consumerRef`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerChange {
    AddAnnotation(String),
    RemoveAnnotation(String),
    ChangeAnnotation(String),
    SetOffline,
    /// A `spec.bmc` field of an existing host changed (the field's name).
    ChangeBmc(&'static str),
    /// A new host has a `spec.bmc` field set (only with [`Policy::restrict_bmc_on_create`]).
    SetBmc(&'static str),
    /// An existing host without `spec.consumerRef` gets one.
    AddConsumerRef,
    /// A `spec.consumerRef` field of an existing host changed (the field's name).
    ChangeConsumerRef(&'static str),
    /// An existing host's `spec.consumerRef` is removed.
    RemoveConsumerRef,
    /// A new host has a `spec.consumerRef` (only with
    /// [`Policy::restrict_consumer_ref_on_create`]).
    SetConsumerRef,
}

/// What a restricted change is about, for the words of a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChangeKind {
    /// A reboot annotation, `spec.online` to false.
    PowerRequest,
    /// `spec.bmc`, metal3's `paused` and `detached`.
    PowerControl,
    /// `spec.consumerRef`.
    Consumer,
}

impl PowerChange {
    /// Whether it asks for power (a reboot annotation, `spec.online` to false) rather than
    /// changing what controls it.
    pub fn is_power_request(&self) -> bool {
        self.kind() == ChangeKind::PowerRequest
    }

    fn kind(&self) -> ChangeKind {
        match self {
            Self::AddAnnotation(key)
            | Self::RemoveAnnotation(key)
            | Self::ChangeAnnotation(key)
                if classify_reboot_annotation(key).is_some() =>
            {
                ChangeKind::PowerRequest
            }
            Self::SetOffline => ChangeKind::PowerRequest,
            Self::AddAnnotation(_)
            | Self::RemoveAnnotation(_)
            | Self::ChangeAnnotation(_)
            | Self::ChangeBmc(_)
            | Self::SetBmc(_) => ChangeKind::PowerControl,
            Self::AddConsumerRef
            | Self::ChangeConsumerRef(_)
            | Self::RemoveConsumerRef
            | Self::SetConsumerRef => ChangeKind::Consumer,
        }
    }
}

impl std::fmt::Display for PowerChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AddAnnotation(key) => write!(f, "add {key}"),
            Self::RemoveAnnotation(key) => write!(f, "remove {key}"),
            Self::ChangeAnnotation(key) => write!(f, "change {key}"),
            Self::SetOffline => f.write_str("set spec.online to false"),
            Self::ChangeBmc(field) => write!(f, "change spec.bmc.{field}"),
            Self::SetBmc(field) => write!(f, "set spec.bmc.{field}"),
            Self::AddConsumerRef => f.write_str("add spec.consumerRef"),
            Self::ChangeConsumerRef(field) => write!(f, "change spec.consumerRef.{field}"),
            Self::RemoveConsumerRef => f.write_str("remove spec.consumerRef"),
            Self::SetConsumerRef => f.write_str("set spec.consumerRef"),
        }
    }
}

/// The `spec.bmc` fields the allow-list guards: together they say which machine the host's
/// power requests reach and how.
pub const BMC_FIELDS: [&str; 3] = [
    "address",
    "credentialsName",
    "disableCertificateVerification",
];

/// The `spec.consumerRef` fields the allow-list guards: together they name the object the
/// host belongs to, and through it the Machine and node whose remediation fences the host.
pub const CONSUMER_REF_FIELDS: [&str; 4] = ["apiVersion", "kind", "namespace", "name"];

/// Whether an object has a `spec.consumerRef` (absent and null are none, as for metal3's
/// pointer).
fn has_consumer_ref(object: &Value) -> bool {
    object
        .get("spec")
        .and_then(|spec| spec.get("consumerRef"))
        .is_some_and(|consumer| !consumer.is_null())
}

/// A `spec.consumerRef` field as metal3 reads it: absent and null are `""`.
fn consumer_ref_field(object: &Value, field: &str) -> Value {
    match object
        .get("spec")
        .and_then(|spec| spec.get("consumerRef"))
        .and_then(|consumer| consumer.get(field))
    {
        None | Some(Value::Null) => Value::String(String::new()),
        Some(value) => value.clone(),
    }
}

/// `spec.consumerRef` changes `old` → `new` of an existing host: added, removed, or the
/// fields that changed.
fn consumer_ref_changes(old: &Value, new: &Value) -> Vec<PowerChange> {
    match (has_consumer_ref(old), has_consumer_ref(new)) {
        (false, false) => Vec::new(),
        (false, true) => vec![PowerChange::AddConsumerRef],
        (true, false) => vec![PowerChange::RemoveConsumerRef],
        (true, true) => CONSUMER_REF_FIELDS
            .into_iter()
            .filter(|field| consumer_ref_field(old, field) != consumer_ref_field(new, field))
            .map(PowerChange::ChangeConsumerRef)
            .collect(),
    }
}

/// The reboot annotations of an object, by key.
fn reboot_annotations(object: &Value) -> BTreeMap<&str, &Value> {
    annotations_where(object, |key| classify_reboot_annotation(key).is_some())
}

/// metal3's `paused` and `detached` annotations of an object, by key: either stops the host
/// from being managed (and so from being powered as its spec says).
fn control_annotations(object: &Value) -> BTreeMap<&str, &Value> {
    annotations_where(object, |key| {
        key == PAUSED_ANNOTATION || key == DETACHED_ANNOTATION
    })
}

fn annotations_where(object: &Value, keep: impl Fn(&str) -> bool) -> BTreeMap<&str, &Value> {
    object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(key, _)| keep(key))
        .map(|(key, value)| (key.as_str(), value))
        .collect()
}

/// A `spec.bmc` field as metal3 reads it: absent and null are Go's zero value (`""`,
/// `false`), so writing the zero value out is no change.
fn bmc_field(object: &Value, field: &str) -> Value {
    let zero = if field == "disableCertificateVerification" {
        Value::Bool(false)
    } else {
        Value::String(String::new())
    };
    match object
        .get("spec")
        .and_then(|spec| spec.get("bmc"))
        .and_then(|bmc| bmc.get(field))
    {
        None | Some(Value::Null) => zero,
        Some(value) => value.clone(),
    }
}

/// Annotation changes `before` → `after`: added, changed, then removed.
fn annotation_changes(
    before: &BTreeMap<&str, &Value>,
    after: &BTreeMap<&str, &Value>,
    changes: &mut Vec<PowerChange>,
) {
    for (key, value) in after {
        match before.get(key) {
            None => changes.push(PowerChange::AddAnnotation(key.to_string())),
            Some(previous) if previous != value => {
                changes.push(PowerChange::ChangeAnnotation(key.to_string()))
            }
            Some(_) => {}
        }
    }
    for key in before.keys().filter(|key| !after.contains_key(*key)) {
        changes.push(PowerChange::RemoveAnnotation(key.to_string()));
    }
}

/// `spec.online`, false when absent (Go's zero value, as metal3 reads it).
fn online(object: &Value) -> bool {
    object
        .pointer("/spec/online")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// The changes `old` → `new` makes that the allow-list restricts (`old` is `None` for a
/// create): reboot annotations, `spec.online` to false, metal3's `paused` and `detached`
/// annotations, and — on an update — `spec.bmc` and `spec.consumerRef`.
pub fn power_changes(old: Option<&Value>, new: &Value) -> Vec<PowerChange> {
    let mut changes = Vec::new();
    let before = old.map(reboot_annotations).unwrap_or_default();
    annotation_changes(&before, &reboot_annotations(new), &mut changes);
    let was_online = old.map(online);
    if !online(new) && was_online != Some(false) {
        changes.push(PowerChange::SetOffline);
    }
    let before = old.map(control_annotations).unwrap_or_default();
    annotation_changes(&before, &control_annotations(new), &mut changes);
    if let Some(old) = old {
        changes.extend(
            BMC_FIELDS
                .into_iter()
                .filter(|field| bmc_field(old, field) != bmc_field(new, field))
                .map(PowerChange::ChangeBmc),
        );
        changes.extend(consumer_ref_changes(old, new));
    }
    changes
}

/// The `spec.bmc` fields a new host sets (to other than Go's zero value).
fn bmc_set_on_create(new: &Value) -> Vec<PowerChange> {
    let empty = Value::Object(Default::default());
    BMC_FIELDS
        .into_iter()
        .filter(|field| bmc_field(new, field) != bmc_field(&empty, field))
        .map(PowerChange::SetBmc)
        .collect()
}

/// Why one reboot annotation's value (or key) is unusable, in words, cut to a readable length
/// (an unknown mode is quoted, and a value may be 256 KiB).
fn value_problem(key: &str, value: &Value) -> Option<String> {
    if classify_reboot_annotation(key) == Some(RebootAnnotationKind::Keyed("")) {
        return Some("the key has nothing after \"reboot.metal3.io/\"".to_string());
    }
    let problem = match value.as_str() {
        Some(text) => check_reboot_value(text).err()?.to_string(),
        None => "the value is not a string".to_string(),
    };
    Some(cut(problem, MAX_PROBLEM_CHARS))
}

/// Longest description of one value's problem.
const MAX_PROBLEM_CHARS: usize = 200;

fn cut(text: String, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    }
}

fn listed<T: ToString>(items: &[T]) -> String {
    let mut words: Vec<String> = items.iter().take(MAX_LISTED).map(T::to_string).collect();
    if items.len() > MAX_LISTED {
        words.push(format!("and {} more", items.len() - MAX_LISTED));
    }
    words.join(", ")
}

/// Who may, in a denial: the flags that list them, not the identities (the webhook's log
/// names them).
pub const ALLOWED_BY_FLAGS: &str = "identities on the webhook's allow-list (--allow-user, \
     --allow-group, --allow-service-account; the webhook's log names them)";

/// Why `user` may not make `changes`: the changes, then what the allow-list covers of the
/// kinds refused, and the flags that list who may.
fn refusal(user: &str, changes: &[PowerChange], host: &str, policy: &Policy) -> String {
    let allowed = ALLOWED_BY_FLAGS;
    let refused = |kind: ChangeKind| changes.iter().any(|c| c.kind() == kind);
    if changes.iter().all(|c| c.kind() == ChangeKind::PowerRequest) {
        // The refusal most users meet, in the words troubleshooting.md quotes.
        return format!(
            "user {user:?} may not {} on BareMetalHost {host}: adding, removing or changing \
             reboot.metal3.io annotations and setting spec.online to false are allowed only to \
             {allowed}",
            listed(changes)
        );
    }
    let mut covered: Vec<String> = Vec::new();
    if refused(ChangeKind::PowerRequest) {
        covered.push("adding, removing or changing reboot.metal3.io annotations".into());
        covered.push("setting spec.online to false".into());
    }
    if refused(ChangeKind::PowerControl) {
        let bmc = if policy.restrict_bmc_on_create {
            "setting or changing spec.bmc"
        } else {
            "changing spec.bmc"
        };
        covered.push(format!(
            "{bmc} and adding, removing or changing the {PAUSED_ANNOTATION} and \
             {DETACHED_ANNOTATION} annotations"
        ));
    }
    if refused(ChangeKind::Consumer) {
        let adding = if policy.restrict_consumer_ref_on_create {
            "setting"
        } else {
            "adding"
        };
        covered.push(format!("{adding}, changing or removing spec.consumerRef"));
    }
    format!(
        "user {user:?} may not {} on BareMetalHost {host}: {} are allowed only to {allowed}",
        listed(changes),
        joined(&covered)
    )
}

/// `a`; `a and b`; `a, b, and c` (and `a, and b` when a part holds an "and" itself).
fn joined(parts: &[String]) -> String {
    match parts {
        [] => String::new(),
        [only] => only.clone(),
        [a, b] if !a.contains(" and ") && !b.contains(" and ") => format!("{a} and {b}"),
        [init @ .., last] => format!("{}, and {last}", init.join(", ")),
    }
}

/// Decides a review read from a body: one whose host objects are not shaped like
/// BareMetalHosts is refused naming the fields (only when the review is one the webhook
/// checks); any other is [`decide`]d.
pub fn decide_review(policy: &Policy, review: &ParsedReview) -> Verdict {
    let request = &review.request;
    if is_checked(request) && !review.shape_problems.is_empty() {
        return Verdict::malformed(format!(
            "the {} review of BareMetalHost {} is not shaped like a BareMetalHost: {}",
            request.operation.as_str(),
            request.object_name(),
            listed(&review.shape_problems)
        ));
    }
    decide(policy, request)
}

/// Whether the webhook looks at a request: a create or update of a host (not a subresource).
fn is_checked(request: &AdmissionRequest) -> bool {
    request.resource.group == HOST_GROUP
        && request.resource.resource == HOST_RESOURCE
        && request.sub_resource.as_deref().unwrap_or("").is_empty()
        && matches!(request.operation, Operation::Create | Operation::Update)
}

/// Decides one admission request.
pub fn decide(policy: &Policy, request: &AdmissionRequest) -> Verdict {
    if !is_checked(request) {
        return Verdict::allowed(Outcome::NotChecked, Vec::new(), Vec::new());
    }
    let host = request.object_name();
    let Some(new) = request.object.as_ref() else {
        return Verdict::malformed(format!(
            "the {} review of BareMetalHost {host} carries no object",
            request.operation.as_str()
        ));
    };
    let old = match request.operation {
        Operation::Update => match request.old_object.as_ref() {
            Some(old) => Some(old),
            None => {
                return Verdict::malformed(format!(
                    "the UPDATE review of BareMetalHost {host} carries no oldObject"
                ));
            }
        },
        _ => None,
    };

    let before = old.map(reboot_annotations).unwrap_or_default();
    let mut invalid = Vec::new();
    let mut warnings = Vec::new();
    for (key, value) in reboot_annotations(new) {
        let Some(problem) = value_problem(key, value) else {
            continue;
        };
        if before.get(key) == Some(&value) {
            warnings.push(format!(
                "{key} keeps an unusable value ({problem}); the controller reads it as a soft request"
            ));
        } else {
            invalid.push(format!("{key}: {problem}"));
        }
    }

    let mut changes = power_changes(old, new);
    if old.is_none() && policy.restrict_bmc_on_create {
        changes.extend(bmc_set_on_create(new));
    }
    if old.is_none() && policy.restrict_consumer_ref_on_create && has_consumer_ref(new) {
        changes.push(PowerChange::SetConsumerRef);
    }
    let refused_by = policy
        .allow
        .as_ref()
        .filter(|list| !changes.is_empty() && !list.allows(&request.user_info));
    if let Some(list) = refused_by {
        let mut message = refusal(&request.user_info.username, &changes, &host, policy);
        if !invalid.is_empty() {
            message.push_str(&format!(
                "; invalid reboot annotation values too: {}",
                listed(&invalid)
            ));
        }
        return Verdict {
            outcome: Outcome::Unauthorized,
            message,
            warnings,
            changes,
            allowed_identities: list.describe(),
        };
    }
    if !invalid.is_empty() {
        return Verdict {
            outcome: Outcome::InvalidValue,
            message: format!(
                "invalid reboot annotation value on BareMetalHost {host}: {} ({ACCEPTED_VALUES})",
                listed(&invalid)
            ),
            warnings,
            changes,
            allowed_identities: String::new(),
        };
    }
    Verdict::allowed(Outcome::Allowed, warnings, changes)
}
