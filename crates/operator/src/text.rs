//! Text that reaches the API server (status messages, Event notes) is bounded: it may come
//! from an API error or a command's output, and an unbounded string makes writes fail.

/// `text` cut to at most `max` bytes (on a character boundary), marked with `…` when cut.
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::bounded;

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
