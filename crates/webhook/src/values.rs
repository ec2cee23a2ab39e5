//! Which reboot annotation values the webhook accepts: those the controller reads as a valid
//! request (the controller's own parser, [`hostcycle_api::parse_reboot_value`]) that metal3's
//! baremetal-operator accepts too, read the same way by both.
//!
//! metal3's webhook decodes a non-empty value with Go's `encoding/json` into
//! `{Mode string "json:mode"; Force bool "json:force"}` and then wants the mode to be `hard`,
//! `soft` or empty. Against the controller's parser that adds three refusals: a blank value
//! (not JSON to Go), a `force` that is not a boolean, and a `mode` key written more than once
//! with a non-string among them. The controller, in turn, flags values metal3 lets through
//! (e.g. a number too large for a float in an ignored key). The webhook accepts only what
//! both accept, and also refuses a value the two read differently (`{"mode":"hard",
//! "mode":null}`: Go keeps `hard`, the controller takes the last key, soft).

use std::fmt;

use hostcycle_api::{InvalidRebootValue, PowerOffMode, parse_reboot_value};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

/// What the webhook says is accepted, appended to every refusal.
pub const ACCEPTED_VALUES: &str = "accepted: an empty value, or a JSON object such as \
     {\"mode\":\"hard\"} whose \"mode\" (if present) is \"hard\", \"soft\" or \"\" \
     (case-sensitive) and whose \"force\" (if present) is true or false";

/// Why a reboot annotation value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueProblem {
    /// The controller's parser flags it (it would act on it as a soft request and warn).
    #[error("{0}")]
    Controller(InvalidRebootValue),
    /// Only spaces: the controller reads a soft request, metal3 refuses it (not JSON).
    #[error("value is only whitespace")]
    Blank,
    /// `force` is present but neither a boolean nor null: metal3 refuses it.
    #[error("\"force\" is not true or false")]
    ForceNotABool,
    /// A `mode` key repeated with a value that is not a string: metal3 refuses it, the
    /// controller reads only the last one.
    #[error("\"mode\" is repeated and one of its values is not a string")]
    RepeatedModeNotAString,
    /// Both accept it but read different modes (a repeated `mode` key ending in null).
    #[error(
        "\"mode\" is repeated and metal3 reads {} where hostcycle reads {}; write \"mode\" once",
        .metal3.as_str(),
        .hostcycle.as_str()
    )]
    Ambiguous {
        metal3: PowerOffMode,
        hostcycle: PowerOffMode,
    },
}

/// Checks one reboot annotation value; `Ok` with the mode both readers agree on.
pub fn check_reboot_value(value: &str) -> Result<PowerOffMode, ValueProblem> {
    let parsed = parse_reboot_value(value);
    if let Some(invalid) = parsed.invalid {
        return Err(ValueProblem::Controller(invalid));
    }
    let metal3 = metal3_mode(value)?;
    if metal3 != parsed.mode {
        return Err(ValueProblem::Ambiguous {
            metal3,
            hostcycle: parsed.mode,
        });
    }
    Ok(parsed.mode)
}

/// The mode metal3 reads from a value the controller already parsed as valid JSON (an object
/// or null, or empty), or why metal3 refuses it.
fn metal3_mode(value: &str) -> Result<PowerOffMode, ValueProblem> {
    if value.is_empty() {
        return Ok(PowerOffMode::Soft);
    }
    if value.trim().is_empty() {
        return Err(ValueProblem::Blank);
    }
    let fields = serde_json::from_str::<GoFields>(value)
        // The controller's parser accepted the same text as an object or null, so only a
        // difference between serde's and Go's JSON grammar could land here: refuse it.
        .map_err(|_| ValueProblem::Controller(InvalidRebootValue::NotJson))?;
    if fields.force_not_bool {
        return Err(ValueProblem::ForceNotABool);
    }
    if fields.mode_not_string {
        return Err(ValueProblem::RepeatedModeNotAString);
    }
    // metal3 powers off hard for exactly "hard"; "soft" and "" are soft.
    Ok(if fields.mode.as_deref() == Some("hard") {
        PowerOffMode::Hard
    } else {
        PowerOffMode::Soft
    })
}

/// Go's `json.Unmarshal` into `{Mode string; Force bool}`: keys match case-insensitively
/// (neither name has a letter with a non-ASCII fold), `null` leaves a field as it was, a value
/// of the wrong type is an error (decoding goes on, the error is returned), other keys are
/// skipped.
#[derive(Debug, Default)]
struct GoFields {
    mode: Option<String>,
    mode_not_string: bool,
    force_not_bool: bool,
}

impl<'de> serde::Deserialize<'de> for GoFields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct GoVisitor;
        impl<'de> Visitor<'de> for GoVisitor {
            type Value = GoFields;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object or null")
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<GoFields, E> {
                Ok(GoFields::default())
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<GoFields, A::Error> {
                let mut fields = GoFields::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key.eq_ignore_ascii_case("mode") {
                        match map.next_value::<serde_json::Value>()? {
                            serde_json::Value::String(mode) => fields.mode = Some(mode),
                            serde_json::Value::Null => {}
                            _ => fields.mode_not_string = true,
                        }
                    } else if key.eq_ignore_ascii_case("force") {
                        match map.next_value::<serde_json::Value>()? {
                            serde_json::Value::Bool(_) | serde_json::Value::Null => {}
                            _ => fields.force_not_bool = true,
                        }
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(fields)
            }
        }
        deserializer.deserialize_any(GoVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PowerOffMode::{Hard, Soft};

    #[test]
    fn accepted_values_and_their_modes() {
        for (value, mode) in [
            ("", Soft),
            ("null", Soft),
            ("{}", Soft),
            (r#"{"mode":"hard"}"#, Hard),
            (r#"{"mode":"soft"}"#, Soft),
            (r#"{"mode":""}"#, Soft),
            (r#"{"mode":null}"#, Soft),
            (r#"{"Mode":"hard"}"#, Hard),
            (r#"{"MODE":"soft"}"#, Soft),
            (r#"{"mode":"hard","force":true}"#, Hard),
            (r#"{"force":false}"#, Soft),
            (r#"{"force":null}"#, Soft),
            (r#"{"mode":"soft","mode":"hard"}"#, Hard),
            (r#"{"mode":"bogus","mode":"hard"}"#, Hard),
            (r#"{"owner":"capm3","uid":"1234","n":[1,{"x":2}]}"#, Soft),
            (" {\"mode\" : \"hard\"} \n", Hard),
        ] {
            assert_eq!(check_reboot_value(value), Ok(mode), "{value:?}");
        }
    }

    #[test]
    fn refused_values_say_why() {
        use InvalidRebootValue::*;
        use ValueProblem::*;
        for (value, problem) in [
            ("hard", Controller(NotJson)),
            ("{mode:hard}", Controller(NotJson)),
            (r#"{"mode":"hard"} x"#, Controller(NotJson)),
            (r#""hard""#, Controller(NotAnObject)),
            ("[]", Controller(NotAnObject)),
            ("true", Controller(NotAnObject)),
            ("5", Controller(NotAnObject)),
            (r#"{"mode":"HARD"}"#, Controller(UnknownMode("HARD".into()))),
            (
                r#"{"mode":"reboot"}"#,
                Controller(UnknownMode("reboot".into())),
            ),
            (r#"{"mode":5}"#, Controller(ModeNotAString)),
            (r#"{"mode":{"x":1}}"#, Controller(ModeNotAString)),
            (r#"{"mode":"hard","mode":5}"#, Controller(ModeNotAString)),
            (" ", Blank),
            ("\n\t", Blank),
            (r#"{"force":"yes"}"#, ForceNotABool),
            (r#"{"Force":1}"#, ForceNotABool),
            (r#"{"mode":5,"mode":"hard"}"#, RepeatedModeNotAString),
            (
                r#"{"mode":"hard","mode":null}"#,
                Ambiguous {
                    metal3: Hard,
                    hostcycle: Soft,
                },
            ),
        ] {
            assert_eq!(check_reboot_value(value), Err(problem), "{value:?}");
        }
    }

    #[test]
    fn accepted_values_are_valid_for_the_controller() {
        for value in ["", "null", r#"{"mode":"hard"}"#, r#"{"force":true}"#] {
            assert_eq!(parse_reboot_value(value).invalid, None, "{value:?}");
        }
    }

    #[test]
    fn messages_are_words() {
        assert_eq!(
            ValueProblem::Controller(InvalidRebootValue::NotJson).to_string(),
            "value is not JSON"
        );
        assert_eq!(
            ValueProblem::Ambiguous {
                metal3: Hard,
                hostcycle: Soft
            }
            .to_string(),
            "\"mode\" is repeated and metal3 reads hard where hostcycle reads soft; write \"mode\" once"
        );
    }
}
