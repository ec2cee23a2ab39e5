#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use hostcycle_api::{
    InvalidRebootValue, PowerOffMode, RebootAnnotationKind, RebootRequests,
    classify_reboot_annotation, is_detached, is_paused, parse_reboot_value,
};
use proptest::prelude::*;

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn classify_keys() {
    use RebootAnnotationKind::*;
    let cases: &[(&str, Option<RebootAnnotationKind>)] = &[
        ("reboot.metal3.io", Some(Suffixless)),
        ("reboot.metal3.io/capbm", Some(Keyed("capbm"))),
        ("reboot.metal3.io/", Some(Keyed(""))),
        ("reboot.metal3.io/a/b", Some(Keyed("a/b"))),
        ("reboot.metal3.ioX", None),
        ("reboot.metal3.io-x/y", None),
        ("xreboot.metal3.io/y", None),
        ("xreboot.metal3.io", None),
        ("Reboot.metal3.io", None),
        ("reboot.metal3.i", None),
        ("", None),
        ("baremetalhost.metal3.io/paused", None),
    ];
    for (key, expected) in cases {
        assert_eq!(classify_reboot_annotation(key), *expected, "{key:?}");
    }
}

#[test]
fn parse_values() {
    use InvalidRebootValue::*;
    use PowerOffMode::*;
    let cases: &[(&str, PowerOffMode, Option<InvalidRebootValue>)] = &[
        ("", Soft, None),
        ("   ", Soft, None),
        (r#"{"mode":"hard"}"#, Hard, None),
        (r#"{"mode":"soft"}"#, Soft, None),
        (r#"{'mode':'hard'}"#, Soft, Some(NotJson)),
        (r#"{"mode":"HARD"}"#, Soft, Some(UnknownMode("HARD".into()))),
        (
            r#"{"mode":"reboot"}"#,
            Soft,
            Some(UnknownMode("reboot".into())),
        ),
        (r#"{"mode":1}"#, Soft, Some(ModeNotAString)),
        (r#"{"mode":null}"#, Soft, None),
        (r#"{"mode":["hard"]}"#, Soft, Some(ModeNotAString)),
        (r#"{}"#, Soft, None),
        (r#"{"uid":"1234","reason":"fencing"}"#, Soft, None),
        (r#"{"mode":"hard","uid":"1234"}"#, Hard, None),
        (r#" {"mode":"hard"} "#, Hard, None),
        ("null", Soft, None),
        (" null ", Soft, None),
        (r#""hard""#, Soft, Some(NotAnObject)),
        ("[1,2]", Soft, Some(NotAnObject)),
        ("hard", Soft, Some(NotJson)),
        ("5f1a0b7c-3e0e-4b8a-9a3c-0d7b8a1c2e3f", Soft, Some(NotJson)),
        (r#"{"mode":"hard""#, Soft, Some(NotJson)),
    ];
    for (value, mode, invalid) in cases {
        let parsed = parse_reboot_value(value);
        assert_eq!(parsed.mode, *mode, "{value:?}");
        assert_eq!(parsed.invalid, *invalid, "{value:?}");
    }
}

/// metal3 decodes the value with Go's `encoding/json` into `{Mode string; Force bool}`: keys
/// match case-insensitively, the last matching key wins, `null` and `""` leave the default
/// (soft) without an error, and `force` never changes the mode.
#[test]
fn parse_values_as_metal3_does() {
    use InvalidRebootValue::*;
    use PowerOffMode::*;
    let cases: &[(&str, PowerOffMode, Option<InvalidRebootValue>)] = &[
        (r#"{"Mode":"hard"}"#, Hard, None),
        (r#"{"MODE":"hard"}"#, Hard, None),
        (r#"{"mOdE":"hard","Force":true}"#, Hard, None),
        (r#"{"mod\u0065":"hard"}"#, Hard, None),
        (r#"{"Mode":"soft"}"#, Soft, None),
        (r#"{"mode":""}"#, Soft, None),
        (r#"{"Mode":""}"#, Soft, None),
        (r#"{"mode":"","force":true}"#, Soft, None),
        (r#"{"force":true}"#, Soft, None),
        (r#"{"mode":"hard","force":false}"#, Hard, None),
        (r#"{"mode":"hard","force":true}"#, Hard, None),
        ("null", Soft, None),
        (r#"{"mode":null}"#, Soft, None),
        // The last key wins, whatever its casing.
        (r#"{"mode":"hard","Mode":"soft"}"#, Soft, None),
        (r#"{"Mode":"soft","mode":"hard"}"#, Hard, None),
        (r#"{"mode":"soft","mode":"hard"}"#, Hard, None),
        // Not the key `mode`.
        (r#"{"modes":"hard"}"#, Soft, None),
        (r#"{"mode ":"hard"}"#, Soft, None),
        // Values stay case-sensitive.
        (r#"{"Mode":"Hard"}"#, Soft, Some(UnknownMode("Hard".into()))),
        (r#"{"Mode":true}"#, Soft, Some(ModeNotAString)),
    ];
    for (value, mode, invalid) in cases {
        let parsed = parse_reboot_value(value);
        assert_eq!(parsed.mode, *mode, "{value:?}");
        assert_eq!(parsed.invalid, *invalid, "{value:?}");
    }
}

#[test]
fn deeply_nested_json_is_soft_not_a_crash() {
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let parsed = parse_reboot_value(&deep);
    assert_eq!(parsed.mode, PowerOffMode::Soft);
    assert!(parsed.invalid.is_some());
}

#[test]
fn summary_of_requests() {
    let a = annotations(&[
        ("reboot.metal3.io/zeta", ""),
        ("reboot.metal3.io/alpha", r#"{"mode":"hard"}"#),
        ("reboot.metal3.io", "not json"),
        ("reboot.metal3.ioX", r#"{"mode":"hard"}"#),
        ("xreboot.metal3.io/other", ""),
        ("unrelated", "x"),
    ]);
    let r = RebootRequests::from_annotations(&a);
    assert!(r.has_suffixless());
    assert!(r.has_keyed());
    assert_eq!(r.keyed_keys(), vec!["alpha", "zeta"]);
    assert_eq!(r.effective_mode(), PowerOffMode::Hard);
    assert_eq!(
        r.annotation_keys(),
        vec![
            "reboot.metal3.io",
            "reboot.metal3.io/alpha",
            "reboot.metal3.io/zeta"
        ]
    );
    assert_eq!(
        r.invalid(),
        vec![("reboot.metal3.io", &InvalidRebootValue::NotJson)]
    );
}

#[test]
fn hard_wins_only_when_present() {
    let soft = RebootRequests::from_annotations(&annotations(&[
        ("reboot.metal3.io/a", r#"{"mode":"soft"}"#),
        ("reboot.metal3.io/b", ""),
        ("reboot.metal3.ioX", r#"{"mode":"hard"}"#),
    ]));
    assert_eq!(soft.effective_mode(), PowerOffMode::Soft);
    let empty = RebootRequests::from_annotations(&BTreeMap::new());
    assert!(empty.is_empty());
    assert_eq!(empty.effective_mode(), PowerOffMode::Soft);
    assert!(empty.annotation_keys().is_empty());
}

#[test]
fn empty_key_still_holds_and_is_flagged() {
    let r = RebootRequests::from_annotations(&annotations(&[("reboot.metal3.io/", "")]));
    assert!(!r.is_empty());
    assert_eq!(r.keyed_keys(), vec![""]);
    assert_eq!(
        r.invalid(),
        vec![("reboot.metal3.io/", &InvalidRebootValue::EmptyKey)]
    );
}

#[test]
fn paused_and_detached_by_presence() {
    let a = annotations(&[("baremetalhost.metal3.io/paused", "")]);
    assert!(is_paused(&a));
    assert!(!is_detached(&a));
    let a = annotations(&[("baremetalhost.metal3.io/detached", "{}")]);
    assert!(is_detached(&a));
    assert!(!is_paused(&a));
}

fn annotation_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("reboot.metal3.io".to_owned()),
        "reboot\\.metal3\\.io/[a-z0-9/._-]{0,12}",
        "x?reboot\\.metal3\\.io[X/]?.{0,6}",
        ".{0,20}",
    ]
}

fn annotation_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(r#"{"mode":"hard"}"#.to_owned()),
        Just(r#"{"mode":"soft"}"#.to_owned()),
        "\\{\"mode\":\"[a-zA-Z]{0,6}\"\\}",
        "\\{\"mode\":[0-9\\[\\]{}nul]{0,6}\\}",
        ".{0,40}",
        any::<Vec<u8>>().prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

proptest! {
    #[test]
    fn parser_never_panics_and_hard_only_from_exact_json(value in annotation_value()) {
        let parsed = parse_reboot_value(&value);
        if parsed.mode == PowerOffMode::Hard {
            let json: serde_json::Value = serde_json::from_str(&value).unwrap();
            let object = json.as_object().unwrap();
            prop_assert!(object
                .iter()
                .any(|(k, v)| k.eq_ignore_ascii_case("mode") && v.as_str() == Some("hard")));
            prop_assert!(parsed.invalid.is_none());
        }
    }

    /// Any casing of the `mode` key, `force` present or not and in any order with other keys:
    /// `hard` is hard; `soft`, `""`, `null` and no `mode` at all are soft; never a warning.
    #[test]
    fn metal3_argument_objects_decode_like_go(
        key in "[mM][oO][dD][eE]",
        mode in prop_oneof![
            Just(Some("\"hard\"")),
            Just(Some("\"soft\"")),
            Just(Some("\"\"")),
            Just(Some("null")),
            Just(None),
        ],
        force in proptest::option::of(any::<bool>()),
        force_key in "[fF][oO][rR][cC][eE]",
        other in proptest::option::of(("[a-z]{1,8}", "[a-zA-Z0-9 ]{0,12}")),
        force_first in any::<bool>(),
    ) {
        let mut members = Vec::new();
        if let Some(mode) = mode {
            members.push(format!("\"{key}\":{mode}"));
        }
        if let Some(force) = force {
            let member = format!("\"{force_key}\":{force}");
            if force_first { members.insert(0, member) } else { members.push(member) }
        }
        if let Some((k, v)) = &other
            && !k.eq_ignore_ascii_case("mode")
        {
            members.push(format!("\"{k}\":\"{v}\""));
        }
        let value = format!("{{{}}}", members.join(","));
        let parsed = parse_reboot_value(&value);
        let expected = if mode == Some("\"hard\"") { PowerOffMode::Hard } else { PowerOffMode::Soft };
        prop_assert_eq!(parsed.mode, expected, "{}", value);
        prop_assert_eq!(parsed.invalid, None, "{}", value);
    }

    #[test]
    fn summary_never_panics_and_is_consistent(
        pairs in proptest::collection::btree_map(annotation_key(), annotation_value(), 0..8)
    ) {
        let r = RebootRequests::from_annotations(&pairs);
        let reboot_keys: Vec<&String> = pairs
            .keys()
            .filter(|k| classify_reboot_annotation(k).is_some())
            .collect();
        prop_assert_eq!(r.annotation_keys().len(), reboot_keys.len());
        prop_assert_eq!(r.is_empty(), reboot_keys.is_empty());
        let any_hard = reboot_keys
            .iter()
            .any(|k| parse_reboot_value(&pairs[*k]).mode == PowerOffMode::Hard);
        prop_assert_eq!(r.effective_mode() == PowerOffMode::Hard, any_hard);
        let keyed = r.keyed_keys();
        let mut sorted = keyed.clone();
        sorted.sort_unstable();
        prop_assert_eq!(keyed, sorted);
    }
}

/// An unknown mode is echoed (Event, log) at most `MAX_ECHOED_MODE` characters long.
#[test]
fn a_huge_unknown_mode_is_clipped_before_it_is_echoed() {
    let huge = "h".repeat(256 * 1024);
    let parsed = parse_reboot_value(&format!(r#"{{"mode":"{huge}"}}"#));
    assert_eq!(parsed.mode, PowerOffMode::Soft);
    let Some(InvalidRebootValue::UnknownMode(mode)) = &parsed.invalid else {
        panic!("unknown mode expected: {parsed:?}");
    };
    assert_eq!(mode.chars().count(), hostcycle_api::MAX_ECHOED_MODE + 1);
    assert!(mode.ends_with('…'), "{mode}");
    // A mode of exactly the limit is echoed whole.
    let exact = "h".repeat(hostcycle_api::MAX_ECHOED_MODE);
    let parsed_exact = parse_reboot_value(&format!(r#"{{"mode":"{exact}"}}"#));
    assert_eq!(
        parsed_exact.invalid,
        Some(InvalidRebootValue::UnknownMode(exact))
    );
    assert!(parsed.invalid.unwrap().to_string().len() < 120);
}
