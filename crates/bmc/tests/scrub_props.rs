//! Property tests for the scrubber: for any password (long enough to be searched for), no
//! encoding of it a BMC may echo survives in scrubbed text — percent and form encoding, HTML
//! character references, JSON string escapes, base64 of it and of `user:password`, and a few
//! of these nested. The encoders here are written independently of the scrubber's decoders.
#![allow(clippy::unwrap_used)]

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use hostcycle_bmc::text::{MIN_SCRUBBED_SECRET_BYTES, REDACTED, WITHHELD, scrub_secret};
use proptest::prelude::*;

/// Characters that matter to the encodings, mixed into generated passwords.
const TRICKY: &[char] = &[
    '&', '<', '>', '"', '\'', '/', '\\', '%', '+', ' ', '=', '?', '#', ';', ':', 'é', '€', '😀',
    '\t', '\u{0}', 'u', 'x', '0', 'a', 'A',
];

fn password() -> impl Strategy<Value = String> {
    let tricky = proptest::sample::select(TRICKY);
    prop_oneof![
        "[ -~]{4,24}",
        proptest::collection::vec(any::<char>(), 4..16).prop_map(|c| c.into_iter().collect()),
        proptest::collection::vec(tricky, 4..16).prop_map(|c| c.into_iter().collect()),
    ]
}

fn username() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9]{0,7}"
}

/// Every byte as `%XX`, upper or lower case.
fn percent_all(text: &str, upper: bool) -> String {
    text.bytes()
        .map(|b| {
            if upper {
                format!("%{b:02X}")
            } else {
                format!("%{b:02x}")
            }
        })
        .collect()
}

/// Unreserved characters kept, the rest `%XX`; `form`: a space as `+`.
fn percent_component(text: &str, form: bool) -> String {
    text.bytes()
        .map(|b| match b {
            b' ' if form => "+".to_string(),
            b if b.is_ascii_alphanumeric() || b"-._~".contains(&b) => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// HTML names this test knows (a subset of HTML's).
const HTML_NAMES: &[(char, &str)] = &[
    ('&', "amp"),
    ('<', "lt"),
    ('>', "gt"),
    ('"', "quot"),
    ('\'', "apos"),
    ('/', "sol"),
    ('é', "eacute"),
    ('€', "euro"),
    ('\u{a0}', "nbsp"),
    ('©', "copy"),
];

/// Each character, by `choices`: raw (never `&`), named, decimal, or hex (`x`/`X`, any digit
/// case).
fn html(text: &str, choices: &[u8]) -> String {
    text.chars()
        .zip(choices.iter().cycle())
        .map(|(c, &choice)| {
            let named = HTML_NAMES
                .iter()
                .find(|(n, _)| *n == c)
                .map(|(_, name)| name);
            match (choice % 5, named) {
                (0, _) if c != '&' => c.to_string(),
                (1, Some(name)) => format!("&{name};"),
                (2, _) => format!("&#{};", c as u32),
                (3, _) => format!("&#x{:x};", c as u32),
                _ => format!("&#X{:04X};", c as u32),
            }
        })
        .collect()
}

/// `\uXXXX` of one UTF-16 unit, any case.
fn json_unit(unit: u16, upper: bool) -> String {
    if upper {
        format!("\\u{unit:04X}")
    } else {
        format!("\\u{unit:04x}")
    }
}

/// A JSON string's content, each character by `choices`: raw where JSON allows it, a short
/// escape where there is one (`\/` for `/` too), or `\u` escapes (surrogate pairs beyond the
/// BMP).
fn json(text: &str, choices: &[u8]) -> String {
    text.chars()
        .zip(choices.iter().cycle())
        .map(|(c, &choice)| {
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '/' => Some("\\/"),
                '\n' => Some("\\n"),
                '\t' => Some("\\t"),
                '\r' => Some("\\r"),
                '\u{8}' => Some("\\b"),
                '\u{c}' => Some("\\f"),
                _ => None,
            };
            let must_escape = c == '"' || c == '\\' || (c as u32) < 0x20;
            match (choice % 3, short) {
                (0, _) if !must_escape => c.to_string(),
                (1, Some(short)) => short.to_string(),
                _ => {
                    let mut units = [0u16; 2];
                    c.encode_utf16(&mut units)
                        .iter()
                        .map(|&u| json_unit(u, choice % 2 == 0))
                        .collect()
                }
            }
        })
        .collect()
}

/// How a BMC may echo the password.
#[derive(Debug, Clone)]
enum Encoding {
    Raw,
    PercentAll { upper: bool },
    PercentComponent { form: bool },
    PercentTwice,
    Html { choices: Vec<u8> },
    HtmlTwice { choices: Vec<u8> },
    Json { choices: Vec<u8> },
    Base64 { engine: usize, with_user: bool },
    PercentInJson { choices: Vec<u8> },
    JsonInHtml { choices: Vec<u8> },
    HtmlInJson { choices: Vec<u8> },
    Base64InPercent { engine: usize },
}

fn encoding() -> impl Strategy<Value = Encoding> {
    let choices = || proptest::collection::vec(any::<u8>(), 1..8);
    prop_oneof![
        Just(Encoding::Raw),
        any::<bool>().prop_map(|upper| Encoding::PercentAll { upper }),
        any::<bool>().prop_map(|form| Encoding::PercentComponent { form }),
        Just(Encoding::PercentTwice),
        choices().prop_map(|choices| Encoding::Html { choices }),
        choices().prop_map(|choices| Encoding::HtmlTwice { choices }),
        choices().prop_map(|choices| Encoding::Json { choices }),
        (0..4usize, any::<bool>())
            .prop_map(|(engine, with_user)| Encoding::Base64 { engine, with_user }),
        choices().prop_map(|choices| Encoding::PercentInJson { choices }),
        choices().prop_map(|choices| Encoding::JsonInHtml { choices }),
        choices().prop_map(|choices| Encoding::HtmlInJson { choices }),
        (0..4usize).prop_map(|engine| Encoding::Base64InPercent { engine }),
    ]
}

fn base64(engine: usize, text: &str) -> String {
    [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD][engine].encode(text)
}

fn encode(encoding: &Encoding, username: &str, password: &str) -> String {
    match encoding {
        Encoding::Raw => password.to_string(),
        Encoding::PercentAll { upper } => percent_all(password, *upper),
        Encoding::PercentComponent { form } => percent_component(password, *form),
        Encoding::PercentTwice => percent_component(&percent_component(password, false), false),
        Encoding::Html { choices } => html(password, choices),
        Encoding::HtmlTwice { choices } => html(&html(password, choices), choices),
        Encoding::Json { choices } => json(password, choices),
        Encoding::Base64 { engine, with_user } => {
            let plain = if *with_user {
                format!("{username}:{password}")
            } else {
                password.to_string()
            };
            base64(*engine, &plain)
        }
        Encoding::PercentInJson { choices } => json(&percent_component(password, false), choices),
        Encoding::JsonInHtml { choices } => html(&json(password, choices), choices),
        Encoding::HtmlInJson { choices } => json(&html(password, choices), choices),
        Encoding::Base64InPercent { engine } => percent_all(&base64(*engine, password), true),
    }
}

/// Where the echo sits: text around it that holds no escape of its own.
const CONTEXTS: &[(&str, &str)] = &[
    ("", ""),
    ("login failed for ", " (code 7)"),
    ("{\"error\":{\"message\":\"bad password ", "\"}}"),
    ("<p>Invalid credential: ", "</p>"),
    ("GET /redfish/v1/Sessions/", "?x=1 HTTP/1.1"),
    ("Authorization: Basic ", "\r\nHost: bmc"),
];

/// The parts of `scrubbed` the scrubber left as they were (between its markers).
fn kept(scrubbed: &str) -> Vec<&str> {
    scrubbed.split(REDACTED).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn no_encoding_of_the_password_survives(
        username in username(),
        password in password(),
        encoding in encoding(),
        context in proptest::sample::select(CONTEXTS),
    ) {
        let encoded = encode(&encoding, &username, &password);
        let (before, after) = context;
        let text = format!("{before}{encoded}{after}");
        let scrubbed = scrub_secret(&text, &username, &password);
        prop_assert!(scrubbed.contains(REDACTED), "nothing scrubbed from {text:?}");
        for part in kept(&scrubbed) {
            prop_assert!(
                !part.contains(&encoded),
                "{encoding:?} of {password:?} survived: {scrubbed:?}"
            );
            prop_assert!(!part.contains(&password), "{password:?} survived: {scrubbed:?}");
        }
    }

    /// Twice in one text, in two different encodings: both go.
    #[test]
    fn two_echoes_in_different_encodings_both_go(
        username in username(),
        password in password(),
        first in encoding(),
        second in encoding(),
    ) {
        let a = encode(&first, &username, &password);
        let b = encode(&second, &username, &password);
        let text = format!("first {a} then {b} end");
        let scrubbed = scrub_secret(&text, &username, &password);
        for part in kept(&scrubbed) {
            prop_assert!(!part.contains(&a), "{first:?} survived: {scrubbed:?}");
            prop_assert!(!part.contains(&b), "{second:?} survived: {scrubbed:?}");
        }
    }

    /// Text that holds no secret and no escape is returned as it was.
    #[test]
    fn clean_text_is_kept(
        username in username(),
        password in password(),
        text in "[a-zA-Z0-9 .,:;()<>!?/=-]{0,200}",
    ) {
        let forms: Vec<String> = std::iter::once(password.clone())
            .chain((0..4).flat_map(|e| {
                [base64(e, &password), base64(e, &format!("{username}:{password}"))]
            }))
            .collect();
        prop_assume!(forms.iter().all(|f| !text.contains(f.as_str())));
        // Nor the password as a request line carries it (URL parsing reads `\` as `/`).
        prop_assume!(!text.contains(&password.replace('\\', "/")));
        prop_assume!(!text.to_ascii_lowercase().contains("x-auth-token"));
        prop_assert_eq!(scrub_secret(&text, &username, &password), text);
    }

    /// A password too short to be searched for without mangling the text: the text is
    /// withheld whole, whatever it is.
    #[test]
    fn short_passwords_withhold_any_text(
        password in "[ -~]{1,3}".prop_filter("short", |p| p.len() < MIN_SCRUBBED_SECRET_BYTES),
        text in ".{1,100}",
    ) {
        prop_assert_eq!(scrub_secret(&text, "admin", &password), WITHHELD);
    }
}
