//! How agentry quotes text that comes from outside (an agent's output, a command's
//! stderr, a value a request sent, a provider's error) in its own messages: cut to a
//! number of characters, with `…` where it was cut, and on one line where the message is
//! a line. Every crate quotes through these functions, so a quoted value never grows a
//! message past its limit and a reader can always tell that it was cut. [`tail`] keeps the
//! end of a text instead (where a log or a stderr says what went wrong).

/// At most `max_chars` characters of `text`, followed by `…` when it was cut.
///
/// ```
/// use agentry_domain::quote::excerpt;
/// assert_eq!(excerpt("sonnet", 10), "sonnet");
/// assert_eq!(excerpt("claude-sonnet-4-5", 6), "claude…");
/// assert_eq!(excerpt("bücher", 2), "bü…");
/// ```
pub fn excerpt(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => {
            let mut out = String::with_capacity(cut + '…'.len_utf8());
            out.push_str(&text[..cut]);
            out.push('…');
            out
        }
        None => text.to_owned(),
    }
}

/// `text` with line breaks and other control characters as spaces, for a message that is
/// one line.
///
/// ```
/// use agentry_domain::quote::one_line;
/// assert_eq!(one_line("no such\nfile\t(os error 2)"), "no such file (os error 2)");
/// ```
pub fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The last `max_bytes` bytes of `text` or fewer, starting at a character boundary: the
/// end of a log or of a stderr, where the error is.
///
/// ```
/// use agentry_domain::quote::tail;
/// assert_eq!(tail("error: bad ref", 7), "bad ref");
/// assert_eq!(tail("short", 10), "short");
/// assert_eq!(tail("aü", 1), ""); // `ü` is two bytes
/// ```
pub fn tail(text: &str, max_bytes: usize) -> &str {
    let mut start = text.len().saturating_sub(max_bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_is_cut_at_characters_never_inside_one() {
        assert_eq!(excerpt("", 0), "");
        assert_eq!(excerpt("a", 0), "…");
        assert_eq!(excerpt("abc", 3), "abc");
        assert_eq!(excerpt("abcd", 3), "abc…");
        // Multi-byte characters count once and are never split.
        assert_eq!(excerpt("ééé", 3), "ééé");
        assert_eq!(excerpt("éééé", 3), "ééé…");
        assert_eq!(excerpt("😀😀", 1), "😀…");
    }

    #[test]
    fn one_line_keeps_everything_but_control_characters() {
        assert_eq!(one_line("a\r\nb\u{7}c\u{85}d"), "a  b c d");
        assert_eq!(one_line("déjà vu — ok"), "déjà vu — ok");
    }
}
