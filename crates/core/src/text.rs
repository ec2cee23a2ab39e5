//! Text that reaches the API server (status messages, condition messages, Event notes) is
//! bounded: it may come from an API error or a command's output, and an unbounded string
//! makes writes fail.

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
