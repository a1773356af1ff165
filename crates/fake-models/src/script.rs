//! The scripted conversation: what the fake model "decides" at each main call, from the
//! agent's prompt (its directives and whether it names a `git diff` command) and from how
//! many tool results the conversation already holds.

use std::time::Duration;

use serde_json::{Map, Value, json};

/// The name of the file the coding script makes the agent write.
pub(crate) const NOTES_FILE: &str = "AGENT_NOTES.md";

/// The most characters of a tool result that a review's final text quotes.
pub(crate) const REVIEW_QUOTE_CHARS: usize = 4000;

/// The most tool calls `[model:calls=N]` asks for.
pub(crate) const MAX_CALLS: u32 = 100;

/// The most calls `[model:gather]` may gather.
pub(crate) const MAX_GATHER: u32 = 1000;

/// The longest `[model:slow=SECS]` honoured, in seconds.
pub(crate) const MAX_SLOW_SECS: f64 = 3600.0;

/// Token counts given by `[model:usage=IN,OUT,CACHE_READ,CACHE_WRITE[,REASONING]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UsageOverride {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub reasoning: u64,
}

/// The `[model:…]` directives found in a prompt.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Directives {
    /// `[model:api-error=CODE]`: every model call answers this HTTP status.
    pub api_error: Option<u16>,
    /// `[model:usage=…]`: the usage of every main call.
    pub usage: Option<UsageOverride>,
    /// `[model:slow=SECS]`: how long the second and later main calls wait.
    pub slow: Option<Duration>,
    /// `[model:calls=N]`: how many tool calls come before the final answer.
    pub calls: Option<u32>,
    /// `[model:hold=SECS]`: how long every model call waits before answering.
    pub hold: Option<Duration>,
    /// `[model:gather=N]`: the first N such calls wait until all N have arrived.
    pub gather: Option<u32>,
    /// `[model:cut]`: a streamed answer breaks off after its first events (the connection
    /// closes without the events that carry the final usage).
    pub cut: bool,
}

impl Directives {
    /// The usage of a main call: `[model:usage=…]`'s if given, else `default`.
    pub(crate) fn main_usage(&self, default: crate::Usage) -> crate::Usage {
        self.usage.map_or(default, |u| crate::Usage {
            input_tokens: u.input,
            output_tokens: u.output,
            cache_read_tokens: u.cache_read,
            cache_write_tokens: u.cache_write,
            reasoning_tokens: u.reasoning,
        })
    }

    /// How long a call waits before its answer: `[model:hold]`, or `[model:slow]` for a
    /// main call after the first (`later_main`), whichever is longer.
    pub(crate) fn delay(&self, later_main: bool) -> Option<Duration> {
        let slow = self.slow.filter(|_| later_main);
        match (self.hold, slow) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Reads every `[model:KEY=VALUE]` in `text`; unknown keys and bad values are ignored, and
    /// for a key given twice the last one wins.
    pub(crate) fn parse(text: &str) -> Self {
        let mut out = Self::default();
        let mut rest = text;
        while let Some(start) = rest.find("[model:") {
            let after = &rest[start + "[model:".len()..];
            let Some(end) = after.find(']') else { break };
            let body = &after[..end];
            rest = &after[end..];
            let Some((key, value)) = body.split_once('=') else {
                if body.trim() == "cut" {
                    out.cut = true;
                }
                continue;
            };
            let value = value.trim();
            match key.trim() {
                "api-error" => {
                    if let Ok(code) = value.parse::<u16>() {
                        out.api_error = Some(if (400..=599).contains(&code) {
                            code
                        } else {
                            500
                        });
                    }
                }
                "usage" => {
                    let numbers: Result<Vec<u64>, _> =
                        value.split(',').map(|n| n.trim().parse::<u64>()).collect();
                    if let Ok(n) = numbers
                        && (4..=5).contains(&n.len())
                    {
                        let at = |i: usize| n.get(i).copied().unwrap_or(0);
                        out.usage = Some(UsageOverride {
                            input: at(0),
                            output: at(1),
                            cache_read: at(2),
                            cache_write: at(3),
                            reasoning: at(4),
                        });
                    }
                }
                "slow" | "hold" => {
                    if let Ok(secs) = value.parse::<f64>()
                        && secs.is_finite()
                        && secs >= 0.0
                    {
                        let wait = Some(Duration::from_secs_f64(secs.min(MAX_SLOW_SECS)));
                        if key.trim() == "slow" {
                            out.slow = wait;
                        } else {
                            out.hold = wait;
                        }
                    }
                }
                "gather" => {
                    if let Ok(n) = value.parse::<u32>()
                        && (1..=MAX_GATHER).contains(&n)
                    {
                        out.gather = Some(n);
                    }
                }
                "calls" => {
                    if let Ok(n) = value.parse::<u32>() {
                        out.calls = Some(n.clamp(1, MAX_CALLS));
                    }
                }
                _ => {}
            }
        }
        out
    }
}

/// What the conversation is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Write `AGENT_NOTES.md` with this many tool calls, then say so.
    Coding {
        /// Tool calls before the final answer (at least 1).
        calls: u32,
    },
    /// Run this `git diff …` command, then quote its output.
    Review {
        /// The command, as the prompt wrote it between backticks.
        command: String,
    },
}

impl Mode {
    /// The mode of a prompt: a review when some `` `git diff…` `` is in backticks, else coding.
    pub(crate) fn of(prompt: &str, directives: &Directives) -> Self {
        match review_command(prompt) {
            Some(command) => Self::Review { command },
            None => Self::Coding {
                calls: directives.calls.unwrap_or(1),
            },
        }
    }
}

/// The first command in single backticks that starts with `git diff` (on one line).
pub(crate) fn review_command(prompt: &str) -> Option<String> {
    prompt
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::trim)
        .find(|s| {
            !s.contains('\n')
                && (*s == "git diff" || s.starts_with("git diff ") || s.starts_with("git diff\t"))
        })
        .map(str::to_owned)
}

/// A tool call the script asks the agent to make, before it is put in a provider's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolAction {
    /// Make `AGENT_NOTES.md` hold `lines` (the notes so far, the newest last). A provider
    /// writes the whole file (Claude's `Write`) or appends the newest line (a shell).
    Notes {
        /// Every line the file should hold after this call, in order.
        lines: Vec<String>,
    },
    /// Run this shell command.
    Run {
        /// The command line.
        command: String,
    },
}

/// What one main call answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// A short text, then a tool call.
    Tool {
        /// The text before the tool call (it names the run tag).
        intro: String,
        /// The tool call.
        action: ToolAction,
    },
    /// The final text.
    Final(String),
}

/// The line that note number `n` (1-based) of `total` holds.
pub(crate) fn note_line(n: u32, total: u32, tag: &str) -> String {
    if n <= 1 {
        format!("notes written by a real agent CLI (fake-models run {tag})")
    } else {
        format!("note {n} of {total} written by a real agent CLI (fake-models run {tag})")
    }
}

/// The answer to the main call that follows `tool_results` tool results.
pub(crate) fn step(mode: &Mode, tag: &str, tool_results: u32, last_result: Option<&str>) -> Step {
    match mode {
        Mode::Review { command } => {
            if tool_results == 0 {
                Step::Tool {
                    intro: format!("I will run `{command}`. [fake-models run {tag}]"),
                    action: ToolAction::Run {
                        command: command.clone(),
                    },
                }
            } else {
                let quoted: String = last_result
                    .unwrap_or_default()
                    .chars()
                    .take(REVIEW_QUOTE_CHARS)
                    .collect();
                Step::Final(format!(
                    "fake-models review (fake-models run {tag}). What the command gave:\n{quoted}"
                ))
            }
        }
        Mode::Coding { calls } => {
            let calls = (*calls).max(1);
            if tool_results < calls {
                let n = tool_results + 1;
                let intro = if n == 1 {
                    format!("I will add the notes. [fake-models run {tag}]")
                } else {
                    format!("Adding note {n} of {calls}. [fake-models run {tag}]")
                };
                Step::Tool {
                    intro,
                    action: ToolAction::Notes {
                        lines: (1..=n).map(|i| note_line(i, calls, tag)).collect(),
                    },
                }
            } else if calls == 1 {
                Step::Final(format!(
                    "Done: added a line to {NOTES_FILE}. (fake-models run {tag})"
                ))
            } else {
                Step::Final(format!(
                    "Done: added {calls} lines to {NOTES_FILE}. (fake-models run {tag})"
                ))
            }
        }
    }
}

/// The run tag that an earlier answer of the fake wrote in `text` (`fake-models run TAG`).
pub(crate) fn find_tag(text: &str) -> Option<String> {
    let mut rest = text;
    while let Some(at) = rest.find("fake-models run ") {
        let after = &rest[at + "fake-models run ".len()..];
        let tag: String = after
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        if tag.len() >= 4 {
            return Some(tag);
        }
        rest = after;
    }
    None
}

/// `text` without its `<system-reminder>…</system-reminder>` sections (Claude Code puts
/// context there, e.g. skill descriptions, that is not the user's prompt).
pub(crate) fn strip_system_reminders(text: &str) -> String {
    const OPEN: &str = "<system-reminder>";
    const CLOSE: &str = "</system-reminder>";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        out.push_str(&rest[..start]);
        match rest[start..].find(CLOSE) {
            Some(end) => rest = &rest[start + end + CLOSE.len()..],
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// `s` quoted for a POSIX shell (single quotes).
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A value that a JSON schema accepts: strings say `fake-models NAME`.
pub(crate) fn example_of(schema: &Value, name: &str) -> Value {
    let ty = schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("object");
    match ty {
        "object" => {
            let mut out = Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (key, sub) in props {
                    out.insert(key.clone(), example_of(sub, key));
                }
            }
            Value::Object(out)
        }
        "array" => json!([]),
        "boolean" => json!(false),
        "integer" | "number" => json!(0),
        "null" => Value::Null,
        _ => Value::String(
            schema
                .get("enum")
                .and_then(Value::as_array)
                .and_then(|e| e.first())
                .and_then(Value::as_str)
                .map_or_else(|| format!("fake-models {name}"), str::to_owned),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_parse() {
        let d = Directives::parse(
            "do it [model:api-error=503] [model:usage=1,2,3,4] [model:slow=0.5] [model:calls=3] \
             [model:nope=1] [model:calls=x]",
        );
        assert_eq!(d.api_error, Some(503));
        assert_eq!(
            d.usage,
            Some(UsageOverride {
                input: 1,
                output: 2,
                cache_read: 3,
                cache_write: 4,
                reasoning: 0
            })
        );
        assert_eq!(d.slow, Some(Duration::from_millis(500)));
        assert_eq!(d.calls, Some(3));
        assert_eq!(
            Directives::parse("[model:api-error=200]").api_error,
            Some(500)
        );
        assert_eq!(Directives::parse("[model:usage=1,2]").usage, None);
        assert_eq!(Directives::parse("[model:slow=-1]").slow, None);
        assert_eq!(Directives::parse("[model:calls=0]").calls, Some(1));
        assert_eq!(Directives::parse("[model:calls=3"), Directives::default());
        let d = Directives::parse("[model:hold=2] [model:slow=5] [model:cut]");
        assert!(d.cut);
        assert_eq!(d.delay(false), Some(Duration::from_secs(2)));
        assert_eq!(d.delay(true), Some(Duration::from_secs(5)));
        assert!(!Directives::parse("[model:cut=no]").cut);
        assert_eq!(Directives::parse("[model:slow=1]").delay(false), None);
    }

    #[test]
    fn review_command_found_in_backticks() {
        for (text, expected) in [
            (
                "Review it: run `git diff origin/main...HEAD` and judge.",
                Some("git diff origin/main...HEAD"),
            ),
            ("`git log` then `git diff`", Some("git diff")),
            ("git diff origin/main", None),
            ("`git difftool`", None),
        ] {
            assert_eq!(review_command(text).as_deref(), expected, "{text}");
        }
    }

    #[test]
    fn coding_steps() {
        let mode = Mode::Coding { calls: 2 };
        let Step::Tool { action, .. } = step(&mode, "t1234", 1, None) else {
            panic!("expected a tool call");
        };
        assert_eq!(
            action,
            ToolAction::Notes {
                lines: vec![
                    "notes written by a real agent CLI (fake-models run t1234)".to_owned(),
                    "note 2 of 2 written by a real agent CLI (fake-models run t1234)".to_owned()
                ]
            }
        );
        assert_eq!(
            step(&mode, "t1234", 2, None),
            Step::Final("Done: added 2 lines to AGENT_NOTES.md. (fake-models run t1234)".into())
        );
    }

    #[test]
    fn schema_examples() {
        let schema = json!({"type": "object", "properties": {"title": {"type": "string"},
                            "ok": {"type": "boolean"}}, "required": ["title"]});
        assert_eq!(
            example_of(&schema, "value"),
            json!({"title": "fake-models title", "ok": false})
        );
    }

    #[test]
    fn tags_and_reminders() {
        for (text, expected) in [
            ("x [fake-models run r12ab34cd] y", Some("r12ab34cd")),
            ("fake-models run ab. fake-models run cdef1", Some("cdef1")),
            ("nothing", None),
        ] {
            assert_eq!(find_tag(text).as_deref(), expected, "{text}");
        }
        assert_eq!(
            strip_system_reminders(
                "a<system-reminder>`git diff`</system-reminder>b<system-reminder>c"
            ),
            "ab"
        );
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
