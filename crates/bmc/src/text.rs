//! Text that comes from a BMC (error bodies, reset types, member ids, tool output) is
//! untrusted: it may be megabytes long and it may echo the password. Everything such text
//! goes through [`from_bmc`] (or [`clip`] where no password is involved) before it is put
//! into an error, an outcome or a log line, and from there into a host's status and Events.

use std::collections::HashSet;
use std::hash::{Hash as _, Hasher as _};
use std::sync::Arc;

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

/// What must never leave one BMC connection in text: the password (with the user name, for
/// the basic-auth token built from both) and the Redfish session tokens the BMC handed out.
/// No `Debug`: it holds the secrets.
#[derive(Clone, Copy)]
pub struct Secrets<'a> {
    pub username: &'a str,
    pub password: &'a str,
    /// `X-Auth-Token` values of sessions the driver opened (the current one and a few
    /// before it: an error about a closed session may quote its token).
    pub tokens: &'a [Arc<str>],
}

impl<'a> Secrets<'a> {
    pub fn new(username: &'a str, password: &'a str) -> Self {
        Secrets {
            username,
            password,
            tokens: &[],
        }
    }

    pub fn with_tokens(self, tokens: &'a [Arc<str>]) -> Self {
        Secrets { tokens, ..self }
    }
}

/// `text` without the password: see [`scrub`].
pub fn scrub_secret(text: &str, username: &str, password: &str) -> String {
    scrub(text, &Secrets::new(username, password))
}

/// `text` without the secrets of one BMC connection. Removed, each replaced by [`REDACTED`]
/// where it stands (the rest of the text is kept as it was):
///
/// - the password, and the session tokens, as they are;
/// - the password in base64, alone and as the basic-auth token `user:password`, in the
///   standard and the URL-safe alphabet, with and without padding;
/// - the password as URL parsing rewrites it in a request line (see [`url_path_forms`]);
/// - any of these encoded — percent-encoding (any case, any part, `+` as a space or not),
///   HTML character references (named, decimal, hexadecimal) and JSON string escapes
///   (`\"`, `\\`, `\/`, `\uXXXX` with surrogate pairs) — or encoded again, up to
///   [`MAX_DECODINGS`] layers in any order;
/// - the value of any `X-Auth-Token` header a BMC echoes (`X-Auth-Token: v`,
///   `"X-Auth-Token": "v"`, `X-Auth-Token=v`), whatever the value.
///
/// A password or token shorter than [`MIN_SCRUBBED_SECRET_BYTES`] cannot be searched for
/// without mangling the text (and showing where its characters are): the whole text is
/// then replaced by [`WITHHELD`] (unless empty). The same rule holds for both, so a BMC that
/// hands out a short token only hides its own messages.
pub fn scrub(text: &str, secrets: &Secrets<'_>) -> String {
    if text.is_empty() {
        return String::new();
    }
    let too_short = |secret: &str| !secret.is_empty() && secret.len() < MIN_SCRUBBED_SECRET_BYTES;
    if too_short(secrets.password) || secrets.tokens.iter().any(|t| too_short(t)) {
        return WITHHELD.to_string();
    }
    // Offsets are kept as u32 to halve the memory of decoded copies; BMC text is capped far
    // below 4 GiB, so this only guards against misuse.
    if u32::try_from(text.len()).is_err() {
        return WITHHELD.to_string();
    }
    let forms = secret_forms(secrets);
    let mut spans = Vec::new();
    find_secrets(text.as_bytes(), &forms, &mut |start, end| {
        spans.push((start, end))
    });
    if text
        .bytes()
        .any(|b| matches!(b, b'%' | b'+' | b'&' | b'\\'))
    {
        let mut search = DecodingSearch {
            forms: &forms,
            spans: &mut spans,
            passes: 0,
            seen: HashSet::new(),
            source_len: text.len(),
        };
        search.run(text.as_bytes());
    }
    replace_spans(text, spans)
}

/// Encodings nested deeper than this are not looked into.
pub const MAX_DECODINGS: usize = 4;

/// Decoding passes made for one text at most (each is linear in the text): enough for every
/// realistic mix of encodings; bounds the work a text full of escapes can cause.
const MAX_DECODING_PASSES: usize = 32;

/// The literal forms of the secrets searched for, in the text and in every decoding of it.
fn secret_forms(secrets: &Secrets<'_>) -> Vec<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let mut forms: Vec<Vec<u8>> = Vec::new();
    let mut add = |form: Vec<u8>| {
        if !form.is_empty() && !forms.contains(&form) {
            forms.push(form);
        }
    };
    let password = secrets.password;
    if !password.is_empty() {
        add(password.as_bytes().to_vec());
        let basic = format!("{}:{password}", secrets.username);
        for plain in [password, basic.as_str()] {
            for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
                add(engine.encode(plain).into_bytes());
            }
        }
        for form in url_path_forms(password) {
            if form.len() >= MIN_SCRUBBED_SECRET_BYTES {
                add(form.into_bytes());
            }
        }
    }
    for token in secrets.tokens {
        add(token.as_bytes().to_vec());
    }
    forms
}

/// Calls `found(start, end)` for every occurrence of a form in `haystack` (overlapping ones
/// too) and for the value of every `X-Auth-Token` header echoed in it.
fn find_secrets(haystack: &[u8], forms: &[Vec<u8>], found: &mut dyn FnMut(usize, usize)) {
    for form in forms {
        find_all(haystack, form, &mut *found);
    }
    find_auth_token_values(haystack, found);
}

/// Every occurrence of `needle` in `haystack`, overlapping ones included (Knuth–Morris–Pratt:
/// linear whatever the text, which a BMC chooses).
fn find_all(haystack: &[u8], needle: &[u8], found: &mut dyn FnMut(usize, usize)) {
    if needle.is_empty() || haystack.len() < needle.len() {
        return;
    }
    let mut fallback = vec![0usize; needle.len()];
    let mut k = 0;
    for i in 1..needle.len() {
        while k > 0 && needle[i] != needle[k] {
            k = fallback[k - 1];
        }
        if needle[i] == needle[k] {
            k += 1;
        }
        fallback[i] = k;
    }
    let mut matched = 0;
    let mut i = 0;
    while i < haystack.len() {
        if matched == 0 {
            // Skip quickly to the next possible start.
            match haystack[i..].iter().position(|&b| b == needle[0]) {
                Some(offset) => i += offset,
                None => return,
            }
        }
        let byte = haystack[i];
        while matched > 0 && byte != needle[matched] {
            matched = fallback[matched - 1];
        }
        if byte == needle[matched] {
            matched += 1;
        }
        if matched == needle.len() {
            found(i + 1 - needle.len(), i + 1);
            matched = fallback[matched - 1];
        }
        i += 1;
    }
}

/// The header whose value a BMC must not echo, lower case.
const AUTH_TOKEN_HEADER: &[u8] = b"x-auth-token";

/// Calls `found` with the value of every `X-Auth-Token` header in `text` (any case):
/// the name, optional quotes, `:` or `=`, optional quotes or `[`, then the value up to a
/// space, a quote or a delimiter.
fn find_auth_token_values(text: &[u8], found: &mut dyn FnMut(usize, usize)) {
    let skip = |mut i: usize, set: &[u8]| {
        while i < text.len() && set.contains(&text[i]) {
            i += 1;
        }
        i
    };
    let mut from = 0;
    while let Some(offset) = text[from..]
        .windows(AUTH_TOKEN_HEADER.len())
        .position(|w| w.eq_ignore_ascii_case(AUTH_TOKEN_HEADER))
    {
        let name_end = from + offset + AUTH_TOKEN_HEADER.len();
        from = name_end;
        let i = skip(name_end, b"\"'\\ \t");
        if i >= text.len() || !matches!(text[i], b':' | b'=') {
            continue;
        }
        let start = skip(i + 1, b"\"'\\ \t[");
        let mut end = start;
        while end < text.len() && !is_token_delimiter(text[end]) {
            end += 1;
        }
        if end > start {
            found(start, end);
            from = end;
        }
    }
}

fn is_token_delimiter(b: u8) -> bool {
    b.is_ascii_whitespace()
        || b.is_ascii_control()
        || matches!(
            b,
            b'"' | b'\''
                | b'\\'
                | b','
                | b';'
                | b'&'
                | b'<'
                | b'>'
                | b'('
                | b')'
                | b'['
                | b']'
                | b'{'
                | b'}'
        )
}

/// The encodings a BMC may wrap text in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    /// `%XX`.
    Percent,
    /// `%XX` and `+` for a space (HTML forms, query strings).
    Form,
    /// `&name;`, `&#NN;`, `&#xHH;`.
    Html,
    /// `\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\uXXXX`.
    Json,
}

const ENCODINGS: [Encoding; 4] = [
    Encoding::Percent,
    Encoding::Json,
    Encoding::Html,
    Encoding::Form,
];

/// Text decoded once, with where in the original text each byte came from.
struct Decoded {
    bytes: Vec<u8>,
    /// `starts[i]`: offset in the original text of the escape (or byte) `bytes[i]` came
    /// from. Non-decreasing; bytes of one escape share it.
    starts: Vec<u32>,
}

/// The search through decodings of one text, breadth first: every single decoding before any
/// double one, and so on (at most [`MAX_DECODINGS`] deep and [`MAX_DECODING_PASSES`] passes).
/// Breadth first, so that the pass budget is never spent on deep decodings of one echo while
/// a shallow decoding of another echo in the same text is still untried.
struct DecodingSearch<'a> {
    forms: &'a [Vec<u8>],
    spans: &'a mut Vec<(usize, usize)>,
    passes: usize,
    /// Decodings already searched (by a hash of their bytes): two orders of decoding often
    /// give the same text.
    seen: HashSet<u64>,
    source_len: usize,
}

impl DecodingSearch<'_> {
    /// Decodes `text` each way, searches each decoding, then decodes those again, level by
    /// level.
    fn run(&mut self, text: &[u8]) {
        let mut level: Vec<Decoded> = Vec::new();
        self.decode_each_way(text, None, &mut level);
        for _ in 1..MAX_DECODINGS {
            let mut next = Vec::new();
            for decoded in &level {
                self.decode_each_way(&decoded.bytes, Some(&decoded.starts), &mut next);
            }
            if next.is_empty() {
                return;
            }
            level = next;
        }
    }

    /// Decodes `bytes` (`starts`: where its bytes came from, `None` for the original text)
    /// once with each encoding, searches every new decoding and adds it to `out`.
    fn decode_each_way(&mut self, bytes: &[u8], starts: Option<&[u32]>, out: &mut Vec<Decoded>) {
        for encoding in ENCODINGS {
            if self.passes >= MAX_DECODING_PASSES {
                return;
            }
            // `+` is the only difference between the two URL decodings.
            if encoding == Encoding::Form && !bytes.contains(&b'+') {
                continue;
            }
            self.passes += 1;
            let Some(decoded) = decode(encoding, bytes, starts) else {
                continue;
            };
            let mut hasher = std::hash::DefaultHasher::new();
            decoded.bytes.hash(&mut hasher);
            if !self.seen.insert(hasher.finish()) {
                continue;
            }
            let source_len = self.source_len;
            let spans = &mut *self.spans;
            find_secrets(&decoded.bytes, self.forms, &mut |start, end| {
                spans.push(source_span(&decoded.starts, source_len, start, end));
            });
            out.push(decoded);
        }
    }
}

/// The part of the original text that decoded bytes `start..end` came from: from the start
/// of the escape of the first byte to the end of the escape of the last (whole escapes, so
/// nothing of an encoded secret is left behind).
fn source_span(starts: &[u32], source_len: usize, start: usize, end: usize) -> (usize, usize) {
    let first = starts[start] as usize;
    let last = starts[end - 1];
    let after = starts[end..]
        .iter()
        .find(|&&s| s != last)
        .map_or(source_len, |&s| s as usize);
    (first, after)
}

/// `bytes` decoded once with `encoding`; `None` when it holds nothing to decode.
fn decode(encoding: Encoding, bytes: &[u8], starts: Option<&[u32]>) -> Option<Decoded> {
    let start_of = |i: usize| match starts {
        Some(starts) => starts[i],
        // The original text: its length fits in u32 (checked by `scrub`).
        None => i as u32,
    };
    let mut out = Decoded {
        bytes: Vec::with_capacity(bytes.len()),
        starts: Vec::with_capacity(bytes.len()),
    };
    let mut changed = false;
    let mut i = 0;
    while i < bytes.len() {
        let unit = match (encoding, bytes[i]) {
            (Encoding::Percent | Encoding::Form, b'%') => percent_escape(&bytes[i..]),
            (Encoding::Form, b'+') => Some((Unit::Byte(b' '), 1)),
            (Encoding::Html, b'&') => html_reference(&bytes[i..]),
            (Encoding::Json, b'\\') => json_escape(&bytes[i..]),
            _ => None,
        };
        let start = start_of(i);
        match unit {
            Some((unit, consumed)) => {
                changed = true;
                let mut utf8 = [0u8; 4];
                let decoded: &[u8] = match &unit {
                    Unit::Byte(b) => std::slice::from_ref(b),
                    Unit::Char(c) => c.encode_utf8(&mut utf8).as_bytes(),
                };
                out.bytes.extend_from_slice(decoded);
                out.starts.extend(std::iter::repeat_n(start, decoded.len()));
                i += consumed;
            }
            None => {
                out.bytes.push(bytes[i]);
                out.starts.push(start);
                i += 1;
            }
        }
    }
    changed.then_some(out)
}

/// What one escape stands for.
enum Unit {
    Byte(u8),
    Char(char),
}

fn hex_value(b: u8) -> Option<u32> {
    (b as char).to_digit(16)
}

/// `%XX` at the start of `bytes`.
fn percent_escape(bytes: &[u8]) -> Option<(Unit, usize)> {
    let high = hex_value(*bytes.get(1)?)?;
    let low = hex_value(*bytes.get(2)?)?;
    Some((Unit::Byte((high * 16 + low) as u8), 3))
}

/// Digits read in a numeric character reference, leading zeros included.
const MAX_REFERENCE_DIGITS: usize = 16;

/// `&name;`, `&#NN;` or `&#xHH;` at the start of `bytes` (the `;` is required).
fn html_reference(bytes: &[u8]) -> Option<(Unit, usize)> {
    let body_end = bytes
        .iter()
        .take(MAX_REFERENCE_DIGITS + 3)
        .position(|&b| b == b';')?;
    let body = &bytes[1..body_end];
    let consumed = body_end + 1;
    let code = match body {
        [b'#', b'x' | b'X', digits @ ..] => parse_digits(digits, 16)?,
        [b'#', digits @ ..] => parse_digits(digits, 10)?,
        name => {
            let name = std::str::from_utf8(name).ok()?;
            return named_reference(name).map(|c| (Unit::Char(c), consumed));
        }
    };
    char::from_u32(code).map(|c| (Unit::Char(c), consumed))
}

fn parse_digits(digits: &[u8], radix: u32) -> Option<u32> {
    if digits.is_empty() || digits.len() > MAX_REFERENCE_DIGITS {
        return None;
    }
    digits.iter().try_fold(0u32, |value, &b| {
        let digit = (b as char).to_digit(radix)?;
        value.checked_mul(radix)?.checked_add(digit)
    })
}

/// HTML's names for the ASCII punctuation and a few more common characters (the Latin-1
/// letters and signs are in [`LATIN1_NAMES`]).
const NAMED_REFERENCES: &[(&str, char)] = &[
    ("Tab", '\t'),
    ("NewLine", '\n'),
    ("excl", '!'),
    ("quot", '"'),
    ("QUOT", '"'),
    ("num", '#'),
    ("dollar", '$'),
    ("percnt", '%'),
    ("amp", '&'),
    ("AMP", '&'),
    ("apos", '\''),
    ("lpar", '('),
    ("rpar", ')'),
    ("ast", '*'),
    ("midast", '*'),
    ("plus", '+'),
    ("comma", ','),
    ("period", '.'),
    ("sol", '/'),
    ("colon", ':'),
    ("semi", ';'),
    ("lt", '<'),
    ("LT", '<'),
    ("equals", '='),
    ("gt", '>'),
    ("GT", '>'),
    ("quest", '?'),
    ("commat", '@'),
    ("lsqb", '['),
    ("lbrack", '['),
    ("bsol", '\\'),
    ("rsqb", ']'),
    ("rbrack", ']'),
    ("Hat", '^'),
    ("lowbar", '_'),
    ("UnderBar", '_'),
    ("grave", '`'),
    ("DiacriticalGrave", '`'),
    ("lcub", '{'),
    ("lbrace", '{'),
    ("verbar", '|'),
    ("vert", '|'),
    ("VerticalLine", '|'),
    ("rcub", '}'),
    ("rbrace", '}'),
    ("tilde", '~'),
    ("OElig", 'Œ'),
    ("oelig", 'œ'),
    ("Scaron", 'Š'),
    ("scaron", 'š'),
    ("Yuml", 'Ÿ'),
    ("ndash", '–'),
    ("mdash", '—'),
    ("lsquo", '‘'),
    ("rsquo", '’'),
    ("ldquo", '“'),
    ("rdquo", '”'),
    ("bull", '•'),
    ("hellip", '…'),
    ("euro", '€'),
    ("trade", '™'),
];

/// HTML's names of U+00A0 to U+00FF, in order.
const LATIN1_NAMES: [&str; 96] = [
    "nbsp", "iexcl", "cent", "pound", "curren", "yen", "brvbar", "sect", "uml", "copy", "ordf",
    "laquo", "not", "shy", "reg", "macr", "deg", "plusmn", "sup2", "sup3", "acute", "micro",
    "para", "middot", "cedil", "sup1", "ordm", "raquo", "frac14", "frac12", "frac34", "iquest",
    "Agrave", "Aacute", "Acirc", "Atilde", "Auml", "Aring", "AElig", "Ccedil", "Egrave", "Eacute",
    "Ecirc", "Euml", "Igrave", "Iacute", "Icirc", "Iuml", "ETH", "Ntilde", "Ograve", "Oacute",
    "Ocirc", "Otilde", "Ouml", "times", "Oslash", "Ugrave", "Uacute", "Ucirc", "Uuml", "Yacute",
    "THORN", "szlig", "agrave", "aacute", "acirc", "atilde", "auml", "aring", "aelig", "ccedil",
    "egrave", "eacute", "ecirc", "euml", "igrave", "iacute", "icirc", "iuml", "eth", "ntilde",
    "ograve", "oacute", "ocirc", "otilde", "ouml", "divide", "oslash", "ugrave", "uacute", "ucirc",
    "uuml", "yacute", "thorn", "yuml",
];

/// The character an HTML name stands for (case-sensitive, as in HTML).
fn named_reference(name: &str) -> Option<char> {
    if let Some(&(_, c)) = NAMED_REFERENCES.iter().find(|(n, _)| *n == name) {
        return Some(c);
    }
    LATIN1_NAMES
        .iter()
        .position(|n| *n == name)
        .and_then(|i| char::from_u32(0xA0 + i as u32))
}

/// A JSON string escape at the start of `bytes`. A lone surrogate is not decoded.
fn json_escape(bytes: &[u8]) -> Option<(Unit, usize)> {
    let simple = match *bytes.get(1)? {
        b'"' => b'"',
        b'\\' => b'\\',
        b'/' => b'/',
        b'b' => 0x08,
        b'f' => 0x0c,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'u' => {
            let unit = utf16_unit(bytes)?;
            if (0xD800..0xDC00).contains(&unit) {
                let low = utf16_unit(bytes.get(6..)?)?;
                if !(0xDC00..0xE000).contains(&low) {
                    return None;
                }
                let code = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                return char::from_u32(code).map(|c| (Unit::Char(c), 12));
            }
            return char::from_u32(unit).map(|c| (Unit::Char(c), 6));
        }
        _ => return None,
    };
    Some((Unit::Byte(simple), 2))
}

/// The code unit of `\uXXXX` at the start of `bytes`.
fn utf16_unit(bytes: &[u8]) -> Option<u32> {
    match bytes.get(..6)? {
        [b'\\', b'u', digits @ ..] => digits
            .iter()
            .try_fold(0u32, |value, &b| Some(value * 16 + hex_value(b)?)),
        _ => None,
    }
}

/// `text` with every span replaced by [`REDACTED`]; spans are widened to whole characters
/// and merged where they overlap or touch.
fn replace_spans(text: &str, mut spans: Vec<(usize, usize)>) -> String {
    if spans.is_empty() {
        return text.to_string();
    }
    for (start, end) in spans.iter_mut() {
        while !text.is_char_boundary(*start) {
            *start -= 1;
        }
        *end = (*end).min(text.len());
        while !text.is_char_boundary(*end) {
            *end += 1;
        }
    }
    spans.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut kept_from = 0;
    let mut current: Option<(usize, usize)> = None;
    for (start, end) in spans {
        match &mut current {
            Some((_, current_end)) if start <= *current_end => {
                *current_end = (*current_end).max(end);
            }
            _ => {
                if let Some((s, e)) = current.take() {
                    out.push_str(&text[kept_from..s]);
                    out.push_str(REDACTED);
                    kept_from = e;
                }
                current = Some((start, end));
            }
        }
    }
    if let Some((s, e)) = current {
        out.push_str(&text[kept_from..s]);
        out.push_str(REDACTED);
        kept_from = e;
    }
    out.push_str(&text[kept_from..]);
    out
}

/// `%XX` escapes decoded (invalid UTF-8 replaced, malformed escapes kept).
fn percent_decode(text: &str) -> String {
    match decode(Encoding::Percent, text.as_bytes(), None) {
        Some(decoded) => String::from_utf8_lossy(&decoded.bytes).into_owned(),
        None => text.to_string(),
    }
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
    let decoded = percent_decode(&form);
    vec![form, decoded]
}

/// BMC text made safe to show: the password removed (see [`scrub`]), then cut to about
/// 1 KiB (see [`clip`]). Scrubbing comes first, so a cut never leaves part of a password
/// behind.
pub fn from_bmc(text: &str, username: &str, password: &str) -> String {
    from_bmc_without(text, &Secrets::new(username, password))
}

/// [`from_bmc`] for all the secrets of a connection (session tokens too).
pub fn from_bmc_without(text: &str, secrets: &Secrets<'_>) -> String {
    // The whole text is scrubbed (it is bounded by the body cap): scrubbing only a head
    // could pull a cut-off part of a password into what is kept.
    clip(&scrub(text, secrets))
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

    /// Found by `scrub_props`: a doubly percent-encoded echo used up the decoding budget
    /// (depth first) before the form decoding of the other echo was tried.
    #[test]
    fn a_deep_echo_does_not_hide_a_shallow_one() {
        let text = "first %252B%2520%255C%252F then %2B+%5C%2F end";
        let scrubbed = scrub_secret(text, "a", "+ \\/");
        assert_eq!(scrubbed, format!("first {REDACTED} then {REDACTED} end"));
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

    /// Each row: the password encoded one way, inside text; the scrubbed text must be the
    /// text with the encoded password replaced, nothing else touched.
    fn assert_scrubbed_rows(password: &str, rows: &[&str]) {
        for encoded in rows {
            let text = format!("login failed for <{encoded}> (code 7)");
            assert_eq!(
                scrub_secret(&text, "admin", password),
                "login failed for <<redacted>> (code 7)",
                "{encoded}"
            );
        }
    }

    #[test]
    fn the_password_as_html_character_references_is_scrubbed() {
        let password = "a&b<c>\"d'é/€x";
        assert_scrubbed_rows(
            password,
            &[
                // Named, as an HTML encoder writes them.
                "a&amp;b&lt;c&gt;&quot;d&apos;&eacute;&sol;&euro;x",
                "a&AMP;b&LT;c&GT;&QUOT;d'é/€x",
                // Decimal and hexadecimal, any case, leading zeros.
                "a&#38;b&#60;c&#62;&#34;d&#39;&#233;&#47;&#8364;x",
                "a&#x26;b&#x3c;c&#x3E;&#X22;d&#x0027;&#xE9;&#x2f;&#x20AC;x",
                "&#97;&#38;&#98;&#60;&#99;&#62;&#34;&#100;&#39;&#233;&#47;&#8364;&#120;",
                // Escaped twice (a template escaping an escaped message).
                "a&amp;amp;b&amp;lt;c&amp;gt;&amp;quot;d&amp;#39;é/€x",
            ],
        );
        // Entities elsewhere in the text stay as they are.
        let clean = "R&amp;D &lt;b&gt; &#169; &nosuch; &#xZZ; &#0;";
        assert_eq!(scrub_secret(clean, "admin", password), clean);
    }

    #[test]
    fn the_password_as_a_json_string_escape_is_scrubbed() {
        let password = "p\"a\\s/s\twörd😀";
        assert_scrubbed_rows(
            password,
            &[
                // serde_json's form, and with `\/`.
                "p\\\"a\\\\s/s\\twörd😀",
                "p\\\"a\\\\s\\/s\\twörd😀",
                // ASCII-only encoders (Python's json.dumps): \u escapes, a surrogate pair.
                "p\\\"a\\\\s/s\\tw\\u00f6rd\\ud83d\\ude00",
                "p\\\"a\\\\s/s\\tw\\u00F6rd\\uD83D\\uDE00",
                // Every character escaped.
                "\\u0070\\u0022\\u0061\\u005c\\u0073\\u002f\\u0073\\u0009\\u0077\\u00f6\\u0072\\u0064\\ud83d\\ude00",
                // A JSON document in a JSON string.
                "p\\\\\\\"a\\\\\\\\s/s\\\\twörd😀",
            ],
        );
        // A lone surrogate or a cut escape does not panic and is kept.
        for odd in ["\\ud83d", "\\ud83d\\u0041", "\\u12", "\\", "\\x"] {
            assert_eq!(scrub_secret(odd, "admin", password), odd);
        }
    }

    #[test]
    fn the_password_percent_and_form_encoded_is_scrubbed() {
        let password = "p a+ß&=%";
        assert_scrubbed_rows(
            password,
            &[
                "p%20a%2B%C3%9F%26%3D%25",
                "p+a%2b%c3%9f%26%3d%25",
                "p%2520a%252B%25C3%259F%2526%253D%2525",
                // Percent-encoded, then put in JSON and HTML.
                "p%20a%2B%C3%9F\\u0026%3D%25",
                "p%20a%2B%C3%9F&amp;%3D%25",
            ],
        );
    }

    #[test]
    fn the_password_in_base64_is_scrubbed() {
        use base64::engine::general_purpose::{
            STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD,
        };
        // Chosen so that the standard and URL-safe alphabets differ (`+/` vs `-_`) and
        // padding is needed.
        let password = "?>?>s3cr";
        for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
            for plain in [password.to_string(), format!("admin:{password}")] {
                let encoded = engine.encode(&plain);
                assert_scrubbed_rows(password, &[encoded.as_str()]);
            }
        }
        assert_eq!(STANDARD.encode(password), "Pz4/PnMzY3I=");
        assert_eq!(URL_SAFE_NO_PAD.encode(password), "Pz4_PnMzY3I");
        assert_eq!(STANDARD.encode("admin:?>?>s3cr"), "YWRtaW46Pz4/PnMzY3I=");
        // Percent-encoded (padding and `/`), as in a query string.
        assert_scrubbed_rows(password, &["Pz4%2FPnMzY3I%3D", "YWRtaW46Pz4%2fPnMzY3I%3d"]);
        assert_eq!(
            scrub_secret(
                "Authorization: Basic YWRtaW46Pz4/PnMzY3I=",
                "admin",
                password
            ),
            "Authorization: Basic <redacted>"
        );
    }

    #[test]
    fn session_tokens_are_scrubbed_like_the_password() {
        let tokens: Vec<Arc<str>> = vec![Arc::from("tok-0ld-1"), Arc::from("8f2a9c7e41d0")];
        let secrets = Secrets::new("admin", "Sekr1t-xyzzy").with_tokens(&tokens);
        for text in [
            "session 8f2a9c7e41d0 expired",
            "session %38f2a9c7e41d0 expired",
            "session \\u0038f2a9c7e41d0 expired",
            "session tok-0ld-1 expired",
        ] {
            assert_eq!(
                scrub(text, &secrets),
                "session <redacted> expired",
                "{text}"
            );
        }
        // A short token is a secret too short to search for: the text is withheld.
        let short: Vec<Arc<str>> = vec![Arc::from("t")];
        let secrets = Secrets::new("admin", "Sekr1t-xyzzy").with_tokens(&short);
        assert_eq!(scrub("Power is on", &secrets), WITHHELD);
    }

    #[test]
    fn echoed_auth_token_headers_are_scrubbed_whatever_their_value() {
        for (text, scrubbed) in [
            (
                "request headers: X-Auth-Token: abc123== Accept: */*",
                "request headers: X-Auth-Token: <redacted> Accept: */*",
            ),
            (
                r#"{"headers": {"X-Auth-Token": "abc/123+x=", "Host": "bmc"}}"#,
                r#"{"headers": {"X-Auth-Token": "<redacted>", "Host": "bmc"}}"#,
            ),
            (
                r#"{"message": "{\"x-auth-token\": \"abc\"}"}"#,
                r#"{"message": "{\"x-auth-token\": \"<redacted>\"}"}"#,
            ),
            ("x-auth-token=abc&b=1", "x-auth-token=<redacted>&b=1"),
            ("X-AUTH-TOKEN:\tabc\r\n", "X-AUTH-TOKEN:\t<redacted>\r\n"),
            ("x-auth-token: [\"abc\"]", "x-auth-token: [\"<redacted>\"]"),
            // Mentions of the header without a value are kept.
            (
                "session created without an X-Auth-Token header",
                "session created without an X-Auth-Token header",
            ),
            ("X-Auth-Token: <redacted>", "X-Auth-Token: <redacted>"),
            ("X-Auth-Token:", "X-Auth-Token:"),
        ] {
            assert_eq!(
                scrub_secret(text, "admin", "Sekr1t-xyzzy"),
                scrubbed,
                "{text}"
            );
            // With no password known (no credentials) too.
            assert_eq!(scrub_secret(text, "", ""), scrubbed, "{text}");
        }
    }

    #[test]
    fn decoding_is_bounded_for_text_full_of_escapes() {
        // Escapes of every kind, nested, over a megabyte: the scrubber finishes and keeps the
        // text (nothing in it is the password).
        let unit = "%25&amp;amp;\\\\u0025+";
        let text = unit.repeat(1024 * 1024 / unit.len());
        let started = std::time::Instant::now();
        assert_eq!(scrub_secret(&text, "admin", "Sekr1t-xyzzy"), text);
        assert!(started.elapsed() < std::time::Duration::from_secs(60));
    }
}
