//! Text an agent wrote that agentry posts on the code host under its own account: a review
//! agent's review, and why a revision round ended (which may quote the agent's stderr or a
//! path it chose). The agent works from an issue anyone may have written, so what it says
//! must not act as agentry: [`quiet`] breaks every `@` mention (`@login`, `@org/team`), so
//! the post pings nobody, and every `<!-- agentry:` marker, so the post cannot pass for one
//! of agentry's own replies (whose markers agentry looks for before posting again).
//!
//! Code is left as it is: inside a fenced block (```` ``` ```` or `~~~`) or an inline code
//! span GitHub links no mention, and a review's code must stay as the agent wrote it. Text
//! stays readable: a ZERO WIDTH SPACE ([`crate::closing_refs::BREAK`]) goes right after the
//! `@` (GitHub reads `@` directly followed by a login as a mention) and inside `agentry:`.

use crate::closing_refs::BREAK;

/// Whether `c` can start a GitHub login (or an organisation's name).
fn starts_login(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// `text` with its mentions and agentry markers broken outside code (see the module's
/// documentation); everything else unchanged.
pub(crate) fn quiet(text: &str) -> String {
    const MARKER: &str = "<!-- agentry:";
    let mut out = String::with_capacity(text.len() + 16);
    let mut fenced = false;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
            out.push_str(line);
            continue;
        }
        if fenced {
            out.push_str(line);
            continue;
        }
        let mut in_code = false;
        let mut prev: Option<char> = None;
        let mut rest = line;
        while let Some(c) = rest.chars().next() {
            let width = c.len_utf8();
            if c == '`' {
                in_code = !in_code;
            }
            if !in_code && rest.starts_with(MARKER) {
                // `<!-- agentry` + BREAK + `:…`
                out.push_str(&MARKER[..MARKER.len() - 1]);
                out.push(BREAK);
                rest = &rest[MARKER.len() - 1..];
                prev = Some('y');
                continue;
            }
            out.push(c);
            let mention = c == '@'
                && !in_code
                && !prev.is_some_and(|p| p.is_alphanumeric() || matches!(p, '_' | '-' | '.'))
                && rest[width..].chars().next().is_some_and(starts_login);
            if mention {
                out.push(BREAK);
            }
            prev = Some(c);
            rest = &rest[width..];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_and_markers_are_broken_outside_code() {
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
        // Code is left alone: inline spans and fenced blocks.
        let code = "use `@Override` here\n```java\n@Override\n<!-- agentry:x -->\n```\n@carol";
        assert_eq!(
            quiet(code),
            format!("use `@Override` here\n```java\n@Override\n<!-- agentry:x -->\n```\n@{b}carol")
        );
        // A marker cannot be forged; the text around it stays.
        assert_eq!(
            quiet("ok <!-- agentry:revision:1:2 --> done"),
            format!("ok <!-- agentry{b}:revision:1:2 --> done")
        );
        assert!(!quiet("<!-- agentry:review:x -->").contains("<!-- agentry:"));
        // Nothing else changes.
        let plain = "Looks fine: see #12 and src/lib.rs:40.\r\n\nbücher";
        assert_eq!(quiet(plain), plain);
    }
}
