//! Text an agent wrote that agentry posts on the code host under its own account: a review
//! agent's review, and why a revision round ended (which may quote the agent's stderr or a
//! path it chose). The agent works from an issue anyone may have written, so what it says
//! must not act as agentry: [`quiet`] breaks every `<!-- agentry:` marker, code included
//! (agentry looks for its markers in the raw text of its own posts before posting again),
//! and every `@` mention (`@login`, `@org/team`) outside code, so the post pings nobody.
//!
//! Code is what GitHub certainly shows as code, and nothing else: a fenced block (a line of
//! at most 3 spaces and 3 or more backticks or tildes, a backtick fence's info string without
//! a backtick, closed by a line of the same character at least as long, or the end of the
//! text) and an inline code span (a run of backticks closed by a run of the same length on
//! the same line). Whatever else looks like code (an unmatched backtick, an indented block,
//! a span across lines) is treated as text: a mention there is broken too, which at worst
//! puts an invisible character in something that was code. Text stays readable: a ZERO
//! WIDTH SPACE ([`crate::closing_refs::BREAK`]) goes right after the `@` (GitHub reads `@`
//! directly followed by a login as a mention) and inside `agentry:`.

use crate::closing_refs::BREAK;

/// The marker prefix agentry's own posts carry.
const MARKER: &str = "<!-- agentry:";

/// A fence line's character and length: at most 3 spaces, then 3 or more backticks or
/// tildes (a backtick fence's info string holding no backtick).
fn fence_of(line: &str) -> Option<(char, usize)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let c = rest.chars().next().filter(|c| matches!(c, '`' | '~'))?;
    let run = rest.len() - rest.trim_start_matches(c).len();
    let info = &rest[run..];
    (run >= 3 && !(c == '`' && info.contains('`'))).then_some((c, run))
}

/// Whether `line` closes a fence of `c` at least `len` long.
fn closes(line: &str, c: char, len: usize) -> bool {
    fence_of(line).is_some_and(|(d, run)| d == c && run >= len)
        && line.trim().trim_start_matches(c).is_empty()
}

/// `text` with agentry's markers broken everywhere and its mentions broken outside code (see
/// the module's documentation); everything else unchanged.
pub(crate) fn quiet(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut fence: Option<(char, usize)> = None;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        match fence {
            Some((c, len)) => {
                if closes(bare, c, len) {
                    fence = None;
                }
                break_markers(line, &mut out);
            }
            None => {
                fence = fence_of(bare);
                if fence.is_some() {
                    break_markers(line, &mut out);
                } else {
                    quiet_line(line, &mut out);
                }
            }
        }
    }
    out
}

/// Pushes `text` with its markers broken.
fn break_markers(text: &str, out: &mut String) {
    let mut rest = text;
    while let Some(at) = rest.find(MARKER) {
        let cut = at + MARKER.len() - 1;
        out.push_str(&rest[..cut]);
        out.push(BREAK);
        rest = &rest[cut..];
    }
    out.push_str(rest);
}

/// Pushes a line of text (not a fence's) with its markers broken, and its mentions broken
/// outside inline code spans.
fn quiet_line(line: &str, out: &mut String) {
    let mut text = String::with_capacity(line.len() + 8);
    let mut prev: Option<char> = None;
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if c == '`' {
            let run = rest.len() - rest.trim_start_matches('`').len();
            if let Some(end) = closing_run(&rest[run..], run) {
                // A code span: as it is (markers aside).
                let span = run + end + run;
                break_markers(&text, out);
                text.clear();
                break_markers(&rest[..span], out);
                rest = &rest[span..];
                prev = Some('`');
                continue;
            }
            // An unmatched run is literal text.
            text.push_str(&rest[..run]);
            rest = &rest[run..];
            prev = Some('`');
            continue;
        }
        let width = c.len_utf8();
        text.push(c);
        let mention = c == '@'
            && !prev.is_some_and(|p| p.is_alphanumeric() || matches!(p, '_' | '-' | '.'))
            && rest[width..]
                .chars()
                .next()
                .is_some_and(|n| n.is_ascii_alphanumeric());
        if mention {
            text.push(BREAK);
        }
        prev = Some(c);
        rest = &rest[width..];
    }
    break_markers(&text, out);
}

/// Where, in `rest`, a run of exactly `len` backticks starts (the end of a code span opened
/// by such a run), if one does.
fn closing_run(rest: &str, len: usize) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = rest[from..].find('`') {
        let start = from + at;
        let run = rest[start..].len() - rest[start..].trim_start_matches('`').len();
        if run == len {
            return Some(start);
        }
        from = start + run;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_are_broken_outside_code_and_markers_everywhere() {
        let b = BREAK;
        assert_eq!(
            quiet("cc @alice and @acme/core, (@bob)"),
            format!("cc @{b}alice and @{b}acme/core, (@{b}bob)")
        );
        // Not mentions: an e-mail address, a lone `@`, `@` before a non-login character.
        assert_eq!(
            quiet("mail a@b.org, 1 @ 2, @-x"),
            "mail a@b.org, 1 @ 2, @-x"
        );
        // Code is left alone, but for markers: inline spans and fenced blocks.
        let code = "use `@Override` here\n```java\n@Override\n<!-- agentry:x -->\n```\n@carol";
        assert_eq!(
            quiet(code),
            format!(
                "use `@Override` here\n```java\n@Override\n<!-- agentry{b}:x -->\n```\n@{b}carol"
            )
        );
        // A marker cannot be forged, in text or in code; the text around it stays.
        assert_eq!(
            quiet("ok <!-- agentry:revision:1:2 --> done"),
            format!("ok <!-- agentry{b}:revision:1:2 --> done")
        );
        for forged in [
            "<!-- agentry:review:x -->",
            "see `<!-- agentry:revision:T:2 -->`",
            "```\n<!-- agentry:task:x -->\n```",
        ] {
            assert!(!quiet(forged).contains(MARKER), "{forged}");
        }
        // Nothing else changes.
        let plain = "Looks fine: see #12 and src/lib.rs:40.\r\n\nbücher `a` ``b`` ~~~";
        assert_eq!(quiet(plain), plain);
    }

    /// What only looks like code is text: its mentions are broken.
    #[test]
    fn what_github_does_not_show_as_code_is_text() {
        let b = BREAK;
        let cases = [
            // An unmatched backtick is a literal one.
            (
                "Don't use ` here, cc @alice",
                format!("Don't use ` here, cc @{b}alice"),
            ),
            // ```x``` is a code span, not a fence; the next line is text.
            (
                "```x``` cc @alice\n@bob\n",
                format!("```x``` cc @{b}alice\n@{b}bob\n"),
            ),
            // Four spaces: not a fence.
            (
                "para\n    ```\n@carol\n",
                format!("para\n    ```\n@{b}carol\n"),
            ),
            // A span of two backticks holding one.
            ("`` ` `` @dave", format!("`` ` `` @{b}dave")),
            // A tilde fence is not closed by backticks; it ends with its own kind.
            (
                "~~~\n@keep\n```\n@keep\n~~~\n@erin",
                format!("~~~\n@keep\n```\n@keep\n~~~\n@{b}erin"),
            ),
            // A fence never closed runs to the end of the text, as GitHub shows it.
            ("```\n@open", "```\n@open".to_owned()),
        ];
        for (text, want) in cases {
            assert_eq!(quiet(text), want, "{text:?}");
        }
    }
}
