//! Import of historical task records (docs/contract.md#39-import), shared by `agentry import` and
//! `POST /api/tasks/import`: JSON Lines, every line validated before anything is written.

use agentry_domain::{AgentType, RepoUrl, TaskState, TaskType, Usd};
use agentry_persistence::tasks::{ImportOutcome, ImportTask, import_tasks};
use agentry_persistence::{AnyConnection, DbError};
use serde::Deserialize;
use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, UtcOffset};
use uuid::Uuid;

/// The earliest `createdAt` accepted.
pub(crate) const IMPORT_EARLIEST: OffsetDateTime = time::macros::datetime!(2000-01-01 00:00 UTC);

/// How far past now a `createdAt` may be (clocks of other systems differ).
pub(crate) const IMPORT_FUTURE_ALLOWANCE: time::Duration = time::Duration::DAY;

/// Longest title accepted.
const MAX_TITLE_CHARS: usize = 1_000;
/// Longest model name accepted.
const MAX_MODEL_CHARS: usize = 100;
/// How many bad lines are counted before validation stops.
const MAX_REPORTED: usize = 1_000;

/// Why an import was refused.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A line is not a valid record; nothing was written.
    #[error("line {line}: {message}{}", more_note(*.more))]
    BadLine {
        /// 1-based line number of the first bad line.
        line: usize,
        /// What is wrong with it, naming the field.
        message: String,
        /// How many further lines are bad too (counted up to a limit).
        more: usize,
    },
    /// The database refused the write; nothing was written.
    #[error(transparent)]
    Db(#[from] DbError),
}

fn more_note(more: usize) -> String {
    match more {
        0 => String::new(),
        1 => " (and 1 more bad line)".to_owned(),
        n => format!(" (and {n} more bad lines)"),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Line {
    title: String,
    repo_url: String,
    task_type: String,
    state: String,
    #[serde(default)]
    agent_type: Option<String>,
    #[serde(default)]
    model_used: Option<String>,
    #[serde(default)]
    cost_usd: Option<String>,
    input_tokens: i64,
    output_tokens: i64,
    created_at: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    pr_url: Option<String>,
    #[serde(default)]
    issue_number: Option<i64>,
}

fn field<T, E: std::fmt::Display>(name: &str, r: Result<T, E>) -> Result<T, String> {
    r.map_err(|e| format!("{name}: {e}"))
}

/// Validates one line into a record. Lines without an `id` get a fresh one.
fn parse_line(text: &str) -> Result<ImportTask, String> {
    let de = &mut serde_json::Deserializer::from_str(text);
    let line: Line = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            format!("not valid JSON: {inner}")
        } else if path == "." {
            format!("not a task record: {inner}")
        } else {
            format!("{path}: {inner}")
        }
    })?;
    for (name, text) in [
        ("title", Some(&line.title)),
        ("modelUsed", line.model_used.as_ref()),
        ("prUrl", line.pr_url.as_ref()),
    ] {
        if text.is_some_and(|t| t.contains('\0')) {
            return Err(format!(
                "{name}: must not contain the NUL character (U+0000)"
            ));
        }
    }
    let title = line.title.trim();
    if title.is_empty() || title.chars().count() > MAX_TITLE_CHARS {
        return Err(format!("title: must be 1 to {MAX_TITLE_CHARS} characters"));
    }
    let model_used = match line.model_used {
        Some(m) if m.trim().is_empty() || m.chars().count() > MAX_MODEL_CHARS => {
            return Err(format!(
                "modelUsed: must be 1 to {MAX_MODEL_CHARS} characters or null"
            ));
        }
        other => other,
    };
    if line.input_tokens < 0 {
        return Err("inputTokens: must not be negative".into());
    }
    if line.output_tokens < 0 {
        return Err("outputTokens: must not be negative".into());
    }
    let created_at = field(
        "createdAt",
        OffsetDateTime::parse(&line.created_at, &Rfc3339),
    )?
    .to_offset(UtcOffset::UTC);
    // The cost rollups keep a row per day from the first task's day to the last one's: a
    // date centuries away (a typo for the year) would make them years long, and every later
    // write rewrite them.
    let latest = OffsetDateTime::now_utc() + IMPORT_FUTURE_ALLOWANCE;
    if created_at < IMPORT_EARLIEST || created_at > latest {
        return Err(format!(
            "createdAt: must be from {} to a day from now",
            IMPORT_EARLIEST.date()
        ));
    }
    let repo_url = field("repoUrl", RepoUrl::parse(&line.repo_url))?;
    let (pr_url, pr_number) = match line.pr_url {
        None => (None, None),
        Some(u) => {
            let number = pull_number_of(&u, &repo_url)?;
            (Some(u), number)
        }
    };
    if line.issue_number.is_some_and(|n| n < 1) {
        return Err("issueNumber: must be an integer of at least 1".into());
    }
    Ok(ImportTask {
        id: match line.id {
            Some(id) => field("id", Uuid::parse_str(&id))?,
            None => Uuid::new_v4(),
        },
        title: title.to_owned(),
        repo_url,
        task_type: field("taskType", line.task_type.parse::<TaskType>())?,
        state: field("state", line.state.parse::<TaskState>())?,
        agent_type: match line.agent_type {
            Some(a) => field("agentType", a.parse::<AgentType>())?,
            None => AgentType::default(),
        },
        model_used,
        cost_usd: line
            .cost_usd
            .map(|c| field("costUsd", Usd::parse(&c)))
            .transpose()?,
        input_tokens: line.input_tokens,
        output_tokens: line.output_tokens,
        created_at,
        pr_url,
        pr_number,
        issue_number: line.issue_number,
    })
}

/// The number of pull request `url` of `repo`, when `url` is `<repo>/pull/<N>` (N at least
/// 1, a trailing `/` allowed; the repository written in any form [`RepoUrl`] accepts over
/// http(s), without credentials, query or fragment); `None` for any other http(s) URL (another
/// repository's pull request, a merge request elsewhere, a page of it), which is kept as the
/// task's `prUrl` without a number: another repository's #7 must not pass for this one's.
///
/// # Errors
///
/// `url` is not an http(s) URL.
fn pull_number_of(url: &str, repo: &RepoUrl) -> Result<Option<i64>, String> {
    let parsed = field("prUrl", url::Url::parse(url))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err("prUrl: must be an http(s) URL".into());
    }
    if !parsed.username().is_empty()
        || parsed.password().is_some()
        || parsed.query().is_some()
        || parsed.fragment().is_some()
    {
        return Ok(None);
    }
    let path = parsed.path();
    let path = path.strip_suffix('/').unwrap_or(path);
    let Some((repo_path, number)) = path.rsplit_once("/pull/") else {
        return Ok(None);
    };
    let Some(number) = Some(number)
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<i64>().ok())
        .filter(|n| *n > 0)
    else {
        return Ok(None);
    };
    let host = parsed.host_str().unwrap_or_default();
    let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
    let scheme = parsed.scheme();
    Ok(
        match RepoUrl::parse(&format!("{scheme}://{host}{port}{repo_path}")) {
            Ok(of) if of == *repo => Some(number),
            _ => None,
        },
    )
}

/// The records of a JSON Lines body with their 1-based line numbers. Blank lines are not
/// records and are passed over; a trailing `\r` (CRLF files) is ignored.
fn records(body: &[u8]) -> impl Iterator<Item = (usize, Result<ImportTask, String>)> + '_ {
    body.split(|b| *b == b'\n')
        .enumerate()
        .filter_map(|(i, raw)| {
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            if raw.iter().all(u8::is_ascii_whitespace) {
                return None;
            }
            let parsed = std::str::from_utf8(raw)
                .map_err(|_| "not valid UTF-8".to_owned())
                .and_then(parse_line);
            Some((i + 1, parsed))
        })
}

/// Checks every line; returns the number of records, or the first bad line.
pub fn validate(body: &[u8]) -> Result<u64, ImportError> {
    let mut count = 0u64;
    let mut first: Option<(usize, String)> = None;
    let mut more = 0usize;
    for (line, parsed) in records(body) {
        match parsed {
            Ok(_) => count += 1,
            Err(message) if first.is_none() => first = Some((line, message)),
            Err(_) => {
                more += 1;
                if more >= MAX_REPORTED {
                    break;
                }
            }
        }
    }
    match first {
        Some((line, message)) => Err(ImportError::BadLine {
            line,
            message,
            more,
        }),
        None => Ok(count),
    }
}

/// Records handed from the parsing thread to the writer at a time.
const PARSED_CHUNK: usize = 4_096;

/// Writes the body in one transaction (docs/contract.md#39-import): a bad line anywhere means
/// nothing is written (the error is the one [`validate`] gives: the first bad line, and how
/// many more there are); records whose id exists already are skipped.
///
/// Each line is parsed once: a second thread parses and validates the lines while this one
/// writes them, so the two cores of a small machine share the work. The first bad line stops
/// the writing and rolls the transaction back; the rest of the body is then only parsed, to
/// count the further bad lines.
pub fn import(conn: &mut AnyConnection, body: &[u8]) -> Result<ImportOutcome, ImportError> {
    std::thread::scope(|scope| {
        let (sender, receiver) = std::sync::mpsc::sync_channel(4);
        let parser = std::thread::Builder::new()
            .name("import-parse".into())
            .spawn_scoped(scope, move || {
                let mut chunk = Vec::with_capacity(PARSED_CHUNK);
                for record in records(body) {
                    chunk.push(record);
                    if chunk.len() == PARSED_CHUNK {
                        let full = std::mem::replace(&mut chunk, Vec::with_capacity(PARSED_CHUNK));
                        // The writer hung up (it failed): nothing more is wanted.
                        if sender.send(full).is_err() {
                            return;
                        }
                    }
                }
                let _ = sender.send(chunk);
            });
        match parser {
            Ok(_) => import_tasks(conn, until_bad_line(receiver.into_iter().flatten())),
            // No second thread to be had: parse here, between the writes.
            Err(_) => import_tasks(conn, until_bad_line(records(body))),
        }
    })
}

/// The records of `parsed` up to its first bad line, which ends the sequence as
/// [`ImportError::BadLine`] counting the bad lines after it (as [`validate`] does).
fn until_bad_line(
    mut parsed: impl Iterator<Item = (usize, Result<ImportTask, String>)>,
) -> impl Iterator<Item = Result<ImportTask, ImportError>> {
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed {
            return None;
        }
        match parsed.next()? {
            (_, Ok(task)) => Some(Ok(task)),
            (line, Err(message)) => {
                failed = true;
                let more = parsed
                    .by_ref()
                    .filter(|(_, r)| r.is_err())
                    .take(MAX_REPORTED)
                    .count();
                Some(Err(ImportError::BadLine {
                    line,
                    message,
                    more,
                }))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"title":"Fix it","repoUrl":"https://github.com/Org/Repo.git","taskType":"coding","state":"completed","costUsd":"0.123456","inputTokens":10,"outputTokens":5,"createdAt":"2026-11-01T10:00:00Z","prUrl":"https://github.com/org/repo/pull/7","issueNumber":3}"#;

    #[test]
    fn a_good_line_is_normalised() {
        let t = parse_line(GOOD).unwrap();
        assert_eq!(t.repo_url.as_str(), "https://github.com/org/repo");
        assert_eq!(t.cost_usd.unwrap().to_string(), "0.123456");
        assert_eq!(t.pr_number, Some(7));
        assert_eq!(t.agent_type, AgentType::ClaudeCode);
    }

    #[test]
    fn bad_lines_name_the_field() {
        let cases = [
            (r#"{"title":"x"}"#, "repoUrl"),
            (&GOOD.replace("0.123456", "-1"), "costUsd"),
            (&GOOD.replace("\"0.123456\"", "0.5"), "costUsd"),
            (&GOOD.replace("coding", "chat"), "taskType"),
            (&GOOD.replace("completed", "done"), "state"),
            (
                &GOOD.replace("2026-11-01T10:00:00Z", "yesterday"),
                "createdAt",
            ),
            (
                &GOOD.replace("\"inputTokens\":10", "\"inputTokens\":-1"),
                "inputTokens",
            ),
            (
                &GOOD.replace("\"issueNumber\":3", "\"issueNumber\":0"),
                "issueNumber",
            ),
            (&GOOD.replace("\"title\"", "\"titel\""), "titel"),
            (&GOOD.replace("Fix it", "  "), "title"),
            (
                &GOOD.replace("Fix it", "Fix\\u0000it"),
                "title: must not contain the NUL",
            ),
            (
                &GOOD.replace(
                    "\"issueNumber\":3",
                    "\"issueNumber\":3,\"modelUsed\":\"m\\u0000\"",
                ),
                "modelUsed: must not contain the NUL",
            ),
            (
                &GOOD.replace("pull/7", "pull/7\\u0000"),
                "prUrl: must not contain the NUL",
            ),
            (
                &GOOD.replace("2026-11-01T10:00:00Z", "2126-11-01T10:00:00Z"),
                "createdAt: must be from 2000-01-01 to a day from now",
            ),
            (
                &GOOD.replace("2026-11-01T10:00:00Z", "1999-12-31T23:59:59Z"),
                "createdAt: must be from 2000-01-01",
            ),
        ];
        for (line, field) in cases {
            let e = parse_line(line).unwrap_err();
            assert!(e.contains(field), "{line} -> {e}");
        }
        assert!(
            parse_line("{not json")
                .unwrap_err()
                .starts_with("not valid JSON")
        );
        assert!(parse_line("[1,2]").is_err());
    }

    // An imported task keeps the number of its pull request only when the pull request is
    // one of the task's repository: another repository's number 7 is not this one's.
    #[test]
    fn only_a_pull_request_of_the_repository_gives_a_number() {
        for (pr_url, number) in [
            ("https://github.com/org/repo/pull/7", 7),
            ("https://github.com/Org/Repo/pull/7/", 7),
            ("http://github.com/org/repo.git/pull/12", 12),
        ] {
            let line = GOOD.replace("https://github.com/org/repo/pull/7", pr_url);
            let t = parse_line(&line).unwrap_or_else(|e| panic!("{pr_url}: {e}"));
            assert_eq!(t.pr_number, Some(number), "{pr_url}");
            assert_eq!(t.pr_url.as_deref(), Some(pr_url));
        }
        // Any other http(s) URL is kept, without a number.
        for pr_url in [
            "https://github.com/other/repo/pull/7",
            "https://github.com/org/other/pull/7",
            "https://ghe.example.com/org/repo/pull/7",
            "https://github.com/org/repo/issues/7",
            "https://github.com/org/repo/pull/0",
            "https://github.com/org/repo/pull/+7",
            "https://github.com/org/repo/pull/7/files",
            "https://github.com/org/repo/pull/7?tab=files",
            "https://github.com/org/repo/pull/7#issuecomment-1",
            "https://token@github.com/org/repo/pull/7",
            "https://github.com/org/repo/pull/99999999999999999999",
            "https://github.com/pull/7",
            "https://github.com/org/repo",
        ] {
            let line = GOOD.replace("https://github.com/org/repo/pull/7", pr_url);
            let t = parse_line(&line).unwrap_or_else(|e| panic!("{pr_url}: {e}"));
            assert_eq!(t.pr_number, None, "{pr_url}");
            assert_eq!(t.pr_url.as_deref(), Some(pr_url));
        }
        let line = GOOD.replace(
            "https://github.com/org/repo/pull/7",
            "ftp://github.com/org/repo/pull/7",
        );
        assert_eq!(
            parse_line(&line).unwrap_err(),
            "prUrl: must be an http(s) URL"
        );
    }

    #[test]
    fn validation_reports_the_first_bad_line_and_counts_the_rest() {
        let body = format!("{GOOD}\n\n{GOOD}\nnope\n{GOOD}\r\nbad too\n");
        match validate(body.as_bytes()) {
            Err(ImportError::BadLine { line, more, .. }) => assert_eq!((line, more), (4, 1)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            validate(format!("{GOOD}\r\n{GOOD}\n").as_bytes()).unwrap(),
            2
        );
        assert_eq!(validate(b"").unwrap(), 0);
    }

    // The import parses each line once, on a second thread, in chunks: its error for a bad
    // body is exactly what validation reports (the first bad line, and how many more, up to
    // the limit), wherever the bad lines fall, and nothing is written. A good body after it
    // imports every line, in more than one chunk.
    #[test]
    fn import_refuses_a_bad_body_as_validation_does_and_writes_nothing() {
        let test_db = agentry_persistence::test_support::TestDb::sqlite();
        let mut conn = test_db.db.conn().unwrap();
        let good = |i: usize| GOOD.replace("Fix it", &format!("Task {i}")) + "\n";
        let good_lines: String = (0..9_000).map(good).collect();
        let bodies = [
            format!("nope\n{good_lines}"),
            format!("{good_lines}nope\n{GOOD}\n{{}}\n\n{GOOD}\r\nbad too\n"),
            format!("{good_lines}{}", "[]\n".repeat(1_500)),
        ];
        for body in bodies {
            let expected = validate(body.as_bytes()).unwrap_err().to_string();
            let got = import(&mut conn, body.as_bytes()).unwrap_err();
            assert!(matches!(got, ImportError::BadLine { .. }), "{got:?}");
            assert_eq!(got.to_string(), expected);
            assert_eq!(agentry_persistence::meta::task_count(&mut conn).unwrap(), 0);
        }
        let outcome = import(&mut conn, good_lines.as_bytes()).unwrap();
        assert_eq!((outcome.imported, outcome.skipped), (9_000, 0));
        assert_eq!(
            agentry_persistence::meta::task_count(&mut conn).unwrap(),
            9_000
        );
    }
}
