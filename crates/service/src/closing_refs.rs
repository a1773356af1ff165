//! GitHub closing keywords in text derived from an issue's title (the commit message and
//! the pull request's title): `fixes #7` there would close issue 7 when the pull request
//! is merged, although the task belongs to another issue. `neutralise` breaks every
//! closing keyword followed by an issue reference, so only the body's `Closes #N` (the
//! task's own issue) closes anything.
//!
//! The keywords are `close`, `closes`, `closed`, `fix`, `fixes`, `fixed`, `resolve`,
//! `resolves`, `resolved` (any case), followed by an optional `:`, whitespace and a
//! reference: `#N`, `GH-N`, `owner/repo#N` or an issue or pull request URL. The text stays
//! readable: a ZERO WIDTH SPACE (U+200B) is inserted right after the keyword (GitHub needs
//! the keyword to be followed by `:` or whitespace) and right after the `#` (or `GH-`) of
//! the reference (GitHub reads `#` directly followed by digits as a reference;
//! `#\u{200b}7` is plain text).

/// The closing keywords, longest first so that `fixes` is matched before `fix`.
const KEYWORDS: [&str; 9] = [
    "resolves", "resolved", "resolve", "closes", "closed", "close", "fixes", "fixed", "fix",
];

/// ZERO WIDTH SPACE, the character `neutralise` inserts.
pub const BREAK: char = '\u{200b}';

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The length in bytes of the longest prefix of `s` whose characters all satisfy `f`.
fn prefix_len(s: &str, f: impl Fn(char) -> bool) -> usize {
    s.chars().take_while(|c| f(*c)).map(char::len_utf8).sum()
}

/// The length in bytes of the closing keyword at the start of `s`, if one is there (and ends
/// at a word boundary).
fn keyword_at(s: &str) -> Option<usize> {
    KEYWORDS.iter().find_map(|k| {
        let head = s.get(..k.len())?;
        let ends = s[k.len()..].chars().next().is_none_or(|c| !is_word(c));
        (head.eq_ignore_ascii_case(k) && ends).then_some(k.len())
    })
}

/// The length in bytes of the issue reference at the start of `s`: `#N`, `GH-N`,
/// `owner/repo#N` or an `http(s)://…/issues/N` or `…/pull/N` URL.
fn reference_at(s: &str) -> Option<usize> {
    let digits = |t: &str| prefix_len(t, |c| c.is_ascii_digit());
    if let Some(rest) = s.strip_prefix('#') {
        let n = digits(rest);
        return (n > 0).then_some(1 + n);
    }
    if s.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("gh-")) {
        let n = digits(&s[3..]);
        return (n > 0).then_some(3 + n);
    }
    let lower = s.get(..8).map(str::to_ascii_lowercase).unwrap_or_default();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        let end = s.find(char::is_whitespace).unwrap_or(s.len());
        let url = &s[..end];
        let is_ref = ["/issues/", "/pull/", "/pulls/"]
            .iter()
            .any(|p| url.find(p).is_some_and(|i| digits(&url[i + p.len()..]) > 0));
        return is_ref.then_some(end);
    }
    // owner/repo#N
    let name = |c: char| c.is_alphanumeric() || matches!(c, '-' | '_' | '.');
    let owner = prefix_len(s, name);
    let rest = s[owner..].strip_prefix('/')?;
    let repo = prefix_len(rest, name);
    let after = rest[repo..].strip_prefix('#')?;
    let n = digits(after);
    (owner > 0 && repo > 0 && n > 0).then_some(owner + 1 + repo + 1 + n)
}

/// `text` with every closing keyword that is followed by an issue reference broken (see the
/// module's documentation); everything else unchanged.
pub(crate) fn neutralise(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut i = 0;
    let mut prev: Option<char> = None;
    while i < text.len() {
        let rest = &text[i..];
        if prev.is_none_or(|c| !is_word(c))
            && let Some(k) = keyword_at(rest)
        {
            // Optional `:`, then whitespace (GitHub also accepts none after the colon).
            let after = &rest[k..];
            let colon = usize::from(after.starts_with(':'));
            let space = prefix_len(&after[colon..], char::is_whitespace);
            let start = k + colon + space;
            if let Some(r) = reference_at(&rest[start..]) {
                out.push_str(&rest[..k]);
                out.push(BREAK);
                out.push_str(&rest[k..start]);
                let reference = &rest[start..start + r];
                // After the `#`, or the `-` of `GH-N`; a URL keeps its text.
                let mark = if reference.contains("://") {
                    None
                } else {
                    reference.find('#').or_else(|| {
                        reference
                            .get(..3)
                            .is_some_and(|p| p.eq_ignore_ascii_case("gh-"))
                            .then_some(2)
                    })
                };
                match mark {
                    Some(h) => {
                        out.push_str(&reference[..=h]);
                        out.push(BREAK);
                        out.push_str(&reference[h + 1..]);
                    }
                    None => out.push_str(reference),
                }
                i += start + r;
                prev = text[..i].chars().next_back();
                continue;
            }
        }
        let Some(c) = rest.chars().next() else { break };
        out.push(c);
        i += c.len_utf8();
        prev = Some(c);
    }
    out
}

/// The issue references that a closing keyword in `text` would close, as GitHub reads them
/// (the references `neutralise` breaks). For tests and checks.
pub fn closing_references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut prev: Option<char> = None;
    for (i, c) in text.char_indices() {
        if prev.is_none_or(|p| !is_word(p))
            && let Some(k) = keyword_at(&text[i..])
        {
            let after = &text[i + k..];
            let colon = usize::from(after.starts_with(':'));
            let space = prefix_len(&after[colon..], char::is_whitespace);
            let start = i + k + colon + space;
            if let Some(r) = reference_at(&text[start..]) {
                found.push(text[start..start + r].to_owned());
            }
        }
        prev = Some(c);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_keywords_before_references_are_broken_and_nothing_else_changes() {
        let title = "fixes #7 and Closes acme/web#8";
        let out = neutralise(title);
        assert_eq!(
            out,
            "fixes\u{200b} #\u{200b}7 and Closes\u{200b} acme/web#\u{200b}8"
        );
        assert_eq!(
            neutralise("Fixes GH-5; closes my-org/my.repo#6"),
            "Fixes\u{200b} GH-\u{200b}5; closes\u{200b} my-org/my.repo#\u{200b}6"
        );
        assert_eq!(closing_references(title), ["#7", "acme/web#8"]);
        assert!(closing_references(&out).is_empty(), "{out:?}");
        // Removing the inserted character gives the title back.
        assert_eq!(out.replace(BREAK, ""), title);

        for (text, refs) in [
            ("Resolved: #12", vec!["#12"]),
            ("FIX:#3", vec!["#3"]),
            (
                "close https://github.com/acme/web/issues/9 now",
                vec!["https://github.com/acme/web/issues/9"],
            ),
            ("closed\t#1, fixed #2", vec!["#1", "#2"]),
            (
                "resolves http://github.com/a/b/pull/4",
                vec!["http://github.com/a/b/pull/4"],
            ),
            ("Fixes GH-5", vec!["GH-5"]),
            ("closes my-org/my.repo#6", vec!["my-org/my.repo#6"]),
        ] {
            assert_eq!(closing_references(text), refs, "{text}");
            let out = neutralise(text);
            assert!(closing_references(&out).is_empty(), "{text}: {out:?}");
            assert_eq!(out.replace(BREAK, ""), text);
        }
        // Not keywords or not references: unchanged.
        for text in [
            "Fix the parser",
            "prefix #7",
            "fixing #7",
            "see #7",
            "fixes issue 7",
            "closes #",
            "fix https://example.com/docs",
            "Fix crash — résolves #x",
            "",
        ] {
            assert_eq!(neutralise(text), text);
            assert!(closing_references(text).is_empty(), "{text}");
        }
    }
}
