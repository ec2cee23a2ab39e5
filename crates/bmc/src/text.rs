//! Text that comes from a BMC (error bodies, reset types, member ids, tool output) is
//! untrusted: it may be megabytes long and it may echo the password. Everything such text
//! goes through [`from_bmc`] (or [`clip`] where no password is involved) before it is put
//! into an error, an outcome or a log line, and from there into a host's status and Events.

use base64::Engine as _;

/// Longest BMC text kept in one field of an error or outcome: about 1 KiB.
pub const MAX_BMC_TEXT_BYTES: usize = 1024;

/// Appended to text that was cut.
pub const TRUNCATED_MARKER: &str = "… (truncated)";

/// Put where the password (or a form of it) was.
pub const REDACTED: &str = "<redacted>";

/// Passwords shorter than this are not searched for: replacing every occurrence of one or
/// two characters would mangle the text and show where the password's characters are. With
/// such a password, BMC text is withheld altogether (see [`scrub_secret`]).
pub const MIN_SCRUBBED_SECRET_BYTES: usize = 4;

/// Shown instead of BMC text when the password is too short to be scrubbed safely.
pub const WITHHELD: &str =
    "(BMC text withheld: the BMC password is too short to remove it from the text reliably)";

/// `text` cut to at most [`MAX_BMC_TEXT_BYTES`] bytes, on a character boundary, ending in
/// [`TRUNCATED_MARKER`] when it was cut.
pub fn clip(text: &str) -> String {
    clip_to(text, MAX_BMC_TEXT_BYTES)
}

/// `text` cut to at most `max` bytes (marker included, when `max` leaves room for it).
pub fn clip_to(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(TRUNCATED_MARKER.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{TRUNCATED_MARKER}", &text[..end])
}

/// Cuts a `String` in place (no copy when it is short enough).
pub fn clip_in_place(text: &mut String) {
    if text.len() > MAX_BMC_TEXT_BYTES {
        *text = clip(text);
    }
}

/// `text` without the password: every occurrence of it, of its JSON-escaped form (a BMC
/// echoing the login body) and of the basic-auth token `base64(user:password)` (a BMC
/// echoing the request headers) becomes [`REDACTED`] — also percent-encoded, in any case and
/// to any part, or form-encoded (a BMC repeating a path, a `Location` or a form body): when
/// the text decoded holds the password, the decoded text is kept, scrubbed. With a password
/// shorter than [`MIN_SCRUBBED_SECRET_BYTES`] the whole text is replaced by [`WITHHELD`]
/// (unless empty).
pub fn scrub_secret(text: &str, username: &str, password: &str) -> String {
    if password.is_empty() || text.is_empty() {
        return text.to_string();
    }
    if password.len() < MIN_SCRUBBED_SECRET_BYTES {
        return WITHHELD.to_string();
    }
    let forms = secret_forms(username, password);
    let mut scrubbed = replace_forms(text, &forms);
    for plus_as_space in [false, true] {
        if let Some(decoded) = scrubbed_when_decoded(&scrubbed, &forms, plus_as_space) {
            scrubbed = decoded;
        }
    }
    scrubbed
}

fn replace_forms(text: &str, forms: &[String]) -> String {
    let mut out = text.to_string();
    for form in forms {
        if out.contains(form.as_str()) {
            out = out.replace(form.as_str(), REDACTED);
        }
    }
    out
}

/// Percent-decodings nested deeper than this are not looked into.
const MAX_DECODINGS: usize = 4;

/// `text` percent-decoded (level after level, as long as that changes it) with every secret
/// form found on the way replaced; `None` when no decoding holds a secret form.
fn scrubbed_when_decoded(text: &str, forms: &[String], plus_as_space: bool) -> Option<String> {
    let mut level = text.to_string();
    let mut found = false;
    for _ in 0..MAX_DECODINGS {
        let next = percent_decode(&level, plus_as_space);
        if next == level {
            break;
        }
        level = next;
        if forms.iter().any(|f| level.contains(f.as_str())) {
            level = replace_forms(&level, forms);
            found = true;
        }
    }
    found.then_some(level)
}

/// `%XX` escapes decoded (invalid UTF-8 replaced, malformed escapes kept), and `+` as a space
/// when `plus_as_space`.
fn percent_decode(text: &str, plus_as_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push((high * 16 + low) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus_as_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The ways a BMC may repeat the password: as is, JSON-escaped, inside a basic-auth token.
fn secret_forms(username: &str, password: &str) -> Vec<String> {
    let mut forms = vec![password.to_string()];
    if let Ok(quoted) = serde_json::to_string(password) {
        let escaped = quoted
            .strip_prefix('"')
            .and_then(|q| q.strip_suffix('"'))
            .unwrap_or(&quoted);
        if escaped != password {
            forms.push(escaped.to_string());
        }
    }
    forms.push(base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}")));
    for form in url_path_forms(password) {
        if form.len() >= MIN_SCRUBBED_SECRET_BYTES && !forms.contains(&form) {
            forms.push(form);
        }
    }
    forms
}

/// The password as a BMC sees it in a request line when the driver sent a request to a path
/// holding it (a reset target or `Location` the BMC gave): URL parsing percent-encodes some
/// characters, reads `\` as `/` and starts a query at `?`. Both that and its decoded form (a
/// BMC repeating its decoded path) are searched for.
fn url_path_forms(password: &str) -> Vec<String> {
    let Ok(base) = url::Url::parse("http://bmc/") else {
        return Vec::new();
    };
    let Ok(joined) = base.join(&format!("/{password}")) else {
        return Vec::new();
    };
    let after_host = &joined[url::Position::BeforePath..];
    let form = after_host
        .strip_prefix('/')
        .unwrap_or(after_host)
        .to_string();
    let decoded = percent_decode(&form, false);
    vec![form, decoded]
}

/// BMC text made safe to show: the password removed (see [`scrub_secret`]), then cut to
/// about 1 KiB (see [`clip`]). Scrubbing comes first, so a cut never leaves part of a
/// password behind.
pub fn from_bmc(text: &str, username: &str, password: &str) -> String {
    // The whole text is scrubbed (it is bounded by the body cap): scrubbing only a head
    // could pull a cut-off part of a password into what is kept.
    clip(&scrub_secret(text, username, password))
}

/// Bytes from a BMC as text (lossy UTF-8), cut to about 1 KiB without decoding the rest.
pub fn clip_bytes(bytes: &[u8]) -> String {
    if bytes.len() <= MAX_BMC_TEXT_BYTES {
        return clip(&String::from_utf8_lossy(bytes));
    }
    let head = String::from_utf8_lossy(&bytes[..MAX_BMC_TEXT_BYTES]);
    let mut end = MAX_BMC_TEXT_BYTES
        .saturating_sub(TRUNCATED_MARKER.len())
        .min(head.len());
    while !head.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{TRUNCATED_MARKER}", &head[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept() {
        assert_eq!(clip("ResetType not supported"), "ResetType not supported");
        assert_eq!(clip(""), "");
    }

    #[test]
    fn long_text_is_cut_on_a_char_boundary_with_a_marker() {
        for unit in ["x", "é", "€", "𝄞"] {
            let long = unit.repeat(4 * 1024 * 1024 / unit.len());
            let cut = clip(&long);
            assert!(cut.len() <= MAX_BMC_TEXT_BYTES, "{}", cut.len());
            assert!(cut.len() > MAX_BMC_TEXT_BYTES - 8, "{}", cut.len());
            assert!(cut.ends_with(TRUNCATED_MARKER));
        }
        // Exactly at the limit: kept whole.
        let exact = "y".repeat(MAX_BMC_TEXT_BYTES);
        assert_eq!(clip(&exact), exact);
    }

    #[test]
    fn clip_to_tiny_limits_does_not_panic() {
        assert_eq!(clip_to("abcdef", 0), TRUNCATED_MARKER);
        assert_eq!(clip_to("ééé", 3), TRUNCATED_MARKER);
    }

    #[test]
    fn bytes_are_cut_without_decoding_everything() {
        let mut bytes = vec![b'a'; 4 * 1024 * 1024];
        bytes[10] = 0xff;
        let text = clip_bytes(&bytes);
        assert!(text.len() <= MAX_BMC_TEXT_BYTES);
        assert!(text.ends_with(TRUNCATED_MARKER));
        assert!(text.contains('\u{fffd}'));
        // Short byte strings are kept (an invalid byte becomes U+FFFD).
        assert_eq!(clip_bytes(b"ok"), "ok");
    }

    #[test]
    fn the_password_and_its_forms_are_scrubbed() {
        let password = "pa\"ss/wörd";
        let basic = base64::engine::general_purpose::STANDARD.encode("admin:pa\"ss/wörd");
        let text = format!(
            "bad login {password}; body {{\"Password\":\"pa\\\"ss/wörd\"}}; header Basic {basic}"
        );
        let scrubbed = scrub_secret(&text, "admin", password);
        assert!(!scrubbed.contains(password), "{scrubbed}");
        assert!(!scrubbed.contains("pa\\\"ss"), "{scrubbed}");
        assert!(!scrubbed.contains(&basic), "{scrubbed}");
        assert_eq!(scrubbed.matches(REDACTED).count(), 3, "{scrubbed}");
        assert!(scrubbed.starts_with("bad login <redacted>;"), "{scrubbed}");
    }

    #[test]
    fn the_password_percent_encoded_is_scrubbed_too() {
        let password = "pa\"ss/wö rd+%x";
        let upper = "pa%22ss%2Fw%C3%B6%20rd%2B%25x";
        let lower = "pa%22ss%2fw%c3%b6%20rd%2b%25x";
        let partly = "pa%22ss/w%C3%B6%20rd+%25x";
        let form = "pa%22ss%2Fw%C3%B6+rd%2B%25x";
        let twice = "pa%2522ss%252Fw%25C3%25B6%2520rd%252B%2525x";
        for encoded in [upper, lower, partly, form, twice] {
            let text = format!("cannot process GET /redfish/v1/Sessions/{encoded} (100%)");
            let scrubbed = scrub_secret(&text, "admin", password);
            assert_eq!(
                scrubbed, "cannot process GET /redfish/v1/Sessions/<redacted> (100%)",
                "{encoded}"
            );
        }
        // Raw and encoded in one text.
        let both = format!("{password} and {upper}");
        assert_eq!(
            scrub_secret(&both, "admin", password),
            "<redacted> and <redacted>"
        );
        // Text without the password keeps its escapes.
        let clean = "GET /redfish/v1/Systems/a%20b?x=1+2 (100%)";
        assert_eq!(scrub_secret(clean, "admin", password), clean);
        // Malformed or cut escapes do not panic.
        for odd in ["%", "%4", "%zz", "a%", "%%41", "%C3"] {
            assert_eq!(scrub_secret(odd, "admin", password), odd);
        }
    }

    #[test]
    fn the_password_as_a_request_line_carries_it_is_scrubbed() {
        // URL parsing reads `\` as `/` and encodes `"` and spaces: a BMC repeating the request
        // line of a request to a path holding the password repeats neither the password nor
        // a percent-encoding of it.
        let password = "Sekr1t\"pa\\ss w?rd";
        for echoed in [
            "cannot process POST /reset/Sekr1t%22pa/ss%20w?rd/Reset",
            "cannot process POST /reset/Sekr1t\"pa/ss w?rd/Reset",
        ] {
            let scrubbed = scrub_secret(echoed, "admin", password);
            assert_eq!(
                scrubbed, "cannot process POST /reset/<redacted>/Reset",
                "{echoed}"
            );
        }
    }

    #[test]
    fn short_passwords_withhold_the_text() {
        assert_eq!(scrub_secret("Power is on", "admin", "on"), WITHHELD);
        assert_eq!(scrub_secret("", "admin", "on"), "");
        // Long enough: only the occurrences go.
        assert_eq!(
            scrub_secret("Power is on, calvin", "root", "calvin"),
            "Power is on, <redacted>"
        );
    }

    #[test]
    fn from_bmc_scrubs_before_cutting() {
        let password = "Sekr1t-xyzzy-4242";
        // The password straddles the cut: it must not survive even partly.
        let mut text = "z".repeat(MAX_BMC_TEXT_BYTES - 20);
        text.push_str(password);
        text.push_str(&"z".repeat(4 * 1024 * 1024));
        let safe = from_bmc(&text, "admin", password);
        assert!(safe.len() <= MAX_BMC_TEXT_BYTES);
        assert!(!safe.contains("Sekr"), "{safe}");
    }
}
