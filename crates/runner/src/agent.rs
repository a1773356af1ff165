//! The two agent CLIs as processes (docs/contract.md#62-agents-and-cost-extraction): how
//! each is invoked, what of the service's environment it sees, and which parser reads its
//! output.
//!
//! | agent | command line (prompt on stdin) |
//! |---|---|
//! | `claude-code` | `claude -p --output-format stream-json --verbose --model M [--max-turns N] [--max-budget-usd B] --permission-mode P` |
//! | `codex` | `codex exec --json --model M [-c openai_base_url="U"] S -` |
//!
//! Both CLIs run headless, with nobody to approve anything, so what the agent may do is
//! decided by where it runs ([`Launch::sandboxed`]):
//!
//! - **Inside agentry's sandbox** the sandbox is the boundary. Claude Code gets
//!   `--permission-mode bypassPermissions` (and `IS_SANDBOX=1`, without which it refuses
//!   that mode to root), so it can run the project's tests and `git diff`; Codex gets
//!   `--dangerously-bypass-approvals-and-sandbox`, because its own sandbox (bubblewrap
//!   again) cannot start inside agentry's.
//! - **Unsandboxed** (`AGENTRY_AGENT_SANDBOX=off`) the agent runs as the service's user, so
//!   it gets a mode that cannot run arbitrary commands: Claude Code `acceptEdits` (file
//!   edits in the working directory only; a review run may also run `git diff`, `git log`,
//!   `git status` and `git show`), Codex `--sandbox workspace-write` (its own sandbox).
//!
//! Codex has no turn or budget option: agentry prices the usage Codex reports and stops the
//! run once the priced cost reaches the allowance ([`OutputParser::allowance_reached`],
//! [`budget_enforceable`]).

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

use agentry_domain::AgentType;
use agentry_domain::money::Usd;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::claude::ClaudeReader;
use crate::codex::CodexReader;
use crate::process::AgentCommand;
use crate::{PriceTable, RunReport, Warnings, excerpt};

/// How to launch the agent of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    /// Which CLI.
    pub agent_type: AgentType,
    /// The model it is launched with (the repository's `codingModel` or `reviewModel`).
    pub model: String,
    /// The turn limit, if any (Claude Code only).
    pub max_turns: Option<i32>,
    /// The most the run may spend, if capped: Claude Code's `--max-budget-usd`; for Codex
    /// the allowance at which agentry stops the run ([`OutputParser::allowance_reached`]).
    pub max_budget_usd: Option<Usd>,
}

impl AgentSpec {
    /// `agent_type` launched with `model`, with no turn limit and no budget.
    pub fn unlimited(agent_type: AgentType, model: impl Into<String>) -> Self {
        AgentSpec {
            agent_type,
            model: model.into(),
            max_turns: None,
            max_budget_usd: None,
        }
    }
}

/// Where and for what an agent is launched, besides its [`AgentSpec`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Launch {
    /// The agent runs inside agentry's sandbox ([`crate::sandbox`]), which is then the
    /// boundary: the CLI is told not to ask for (nor impose) permissions of its own.
    pub sandboxed: bool,
    /// A review run: it reads the change (`git diff`, `git log`, …) and changes nothing.
    pub review: bool,
}

/// The Bash commands an unsandboxed review agent may run (Claude Code `--allowedTools`
/// rules): reading the change, nothing else.
const REVIEW_READ_ONLY_TOOLS: &str =
    "Bash(git diff:*),Bash(git log:*),Bash(git status:*),Bash(git show:*)";

/// Whether agentry can hold `spec`'s agent to its allowance: `Err` with a sentence saying
/// why not. Claude Code enforces its own (`--max-budget-usd`); a Codex run is stopped by
/// agentry from its priced usage, which needs the launched model in `prices`. A capped
/// Codex run of an unpriced model is refused rather than run without its cap.
pub fn budget_enforceable(spec: &AgentSpec, prices: &PriceTable) -> Result<(), String> {
    match (spec.agent_type, spec.max_budget_usd) {
        (AgentType::Codex, Some(allowance)) if prices.get(&spec.model).is_none() => Err(format!(
            "budget not enforceable: this run may spend at most {allowance} USD, but model {:?} \
             has no price, so Codex's usage cannot be priced as it runs (add the model to \
             AGENTRY_PRICES_FILE)",
            excerpt(&spec.model)
        )),
        _ => Ok(()),
    }
}

/// The environment variables through which an operator gives an agent its credentials.
/// Those that are set for the service reach the agent that uses them (Codex's as
/// `CODEX_API_KEY`, the only one `codex exec` reads).
pub fn api_key_vars(agent_type: AgentType) -> &'static [&'static str] {
    match agent_type {
        AgentType::ClaudeCode => &[
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_AUTH_TOKEN",
            "CLAUDE_CODE_OAUTH_TOKEN",
        ],
        AgentType::Codex => &["CODEX_API_KEY", "OPENAI_API_KEY"],
    }
}

/// The variable that names the OpenAI base URL for the operator. Codex ignores it; agentry
/// passes its value as Codex's `openai_base_url` configuration when it is given to agents
/// (`AGENTRY_AGENT_ENV`).
pub const OPENAI_BASE_URL: &str = "OPENAI_BASE_URL";

/// The `PATH` agents get when the service has none.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What of the service's environment may reach agents: `PATH`, the credential variables
/// ([`api_key_vars`]) and the variables the operator lists in `AGENTRY_AGENT_ENV`, read
/// once at start. Nothing else of the service's environment ever reaches an agent. Its
/// `Debug` shows names, never values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ServiceEnv {
    /// The service's `PATH`, if set and not empty.
    pub path: Option<String>,
    /// The credential variables that are set, name and value.
    pub credentials: Vec<(String, String)>,
    /// The variables of `AGENTRY_AGENT_ENV` that are set, name and value: given to every
    /// agent.
    pub passed: Vec<(String, String)>,
}

impl fmt::Debug for ServiceEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |vars: &[(String, String)]| vars.iter().map(|(k, _)| k.clone()).collect();
        f.debug_struct("ServiceEnv")
            .field("path", &self.path)
            .field("credentials", &names(&self.credentials) as &Vec<String>)
            .field("passed", &names(&self.passed) as &Vec<String>)
            .finish()
    }
}

impl ServiceEnv {
    /// Reads `PATH`, every agent's credential variables and the variables named in
    /// `passed` through `lookup` (the service's environment); empty values count as unset.
    pub fn read(passed: &[String], lookup: impl Fn(&str) -> Option<String>) -> Self {
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let credentials = api_key_vars(AgentType::ClaudeCode)
            .iter()
            .chain(api_key_vars(AgentType::Codex))
            .filter_map(|name| Some(((*name).to_owned(), get(name)?)))
            .collect();
        let passed = passed
            .iter()
            .filter_map(|name| Some((name.clone(), get(name)?)))
            .collect();
        ServiceEnv {
            path: get("PATH"),
            credentials,
            passed,
        }
    }

    fn credential(&self, name: &str) -> Option<&str> {
        self.credentials
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of a passed variable (`AGENTRY_AGENT_ENV`).
    pub fn passed(&self, name: &str) -> Option<&str> {
        self.passed
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The complete environment of an agent process: `PATH` (the service's, else
/// [`DEFAULT_PATH`]), `HOME` = `home` (the run's own), the agent's credentials, the
/// variables of `AGENTRY_AGENT_ENV`, and what the CLI needs to run headless (Claude Code:
/// `DISABLE_AUTOUPDATER=1` and `DISABLE_ERROR_REPORTING=1`: no update behind the version
/// check, no crash reports with the repository's content; not `DISABLE_TELEMETRY` nor
/// `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`, with which Claude Code 2.1.197 prints no
/// result event on `SIGINT`, so a stopped run's cost would be lost; inside the
/// sandbox `IS_SANDBOX=1`). Codex gets its key as `CODEX_API_KEY` (from `CODEX_API_KEY`,
/// else `OPENAI_API_KEY`). A passed variable never replaces `PATH`, `HOME` or a
/// credential.
pub fn environment(
    agent_type: AgentType,
    launch: Launch,
    home: &Path,
    service: &ServiceEnv,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".to_owned(),
            service
                .path
                .clone()
                .unwrap_or_else(|| DEFAULT_PATH.to_owned()),
        ),
        ("HOME".to_owned(), home.to_string_lossy().into_owned()),
    ];
    let mut set = |name: &str, value: &str| {
        if !env.iter().any(|(k, _)| k == name) {
            env.push((name.to_owned(), value.to_owned()));
        }
    };
    match agent_type {
        AgentType::ClaudeCode => {
            for name in api_key_vars(agent_type) {
                if let Some(value) = service.credential(name) {
                    set(name, value);
                }
            }
            set("DISABLE_AUTOUPDATER", "1");
            set("DISABLE_ERROR_REPORTING", "1");
            if launch.sandboxed {
                set("IS_SANDBOX", "1");
            }
        }
        AgentType::Codex => {
            if let Some(key) = service
                .credential("CODEX_API_KEY")
                .or_else(|| service.credential("OPENAI_API_KEY"))
            {
                set("CODEX_API_KEY", key);
            }
        }
    }
    for (name, value) in &service.passed {
        set(name, value);
    }
    env
}

/// The arguments of an agent's command line (after the program name), for an agent with
/// the environment `env` (Codex's base URL comes from [`OPENAI_BASE_URL`] there).
pub fn arguments(spec: &AgentSpec, launch: Launch, env: &[(String, String)]) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    match spec.agent_type {
        AgentType::ClaudeCode => {
            args.extend(
                [
                    "-p",
                    "--output-format",
                    "stream-json",
                    "--verbose",
                    "--model",
                ]
                .map(str::to_owned),
            );
            args.push(spec.model.clone());
            if let Some(turns) = spec.max_turns {
                args.push("--max-turns".into());
                args.push(turns.to_string());
            }
            if let Some(budget) = spec.max_budget_usd {
                args.push("--max-budget-usd".into());
                args.push(budget.to_string());
            }
            args.push("--permission-mode".into());
            if launch.sandboxed {
                args.push("bypassPermissions".into());
            } else {
                args.push("acceptEdits".into());
                if launch.review {
                    args.push("--allowedTools".into());
                    args.push(REVIEW_READ_ONLY_TOOLS.into());
                }
            }
        }
        AgentType::Codex => {
            args.extend(["exec", "--json", "--model"].map(str::to_owned));
            args.push(spec.model.clone());
            if let Some((_, url)) = env.iter().find(|(k, _)| k == OPENAI_BASE_URL) {
                args.push("-c".into());
                args.push(format!("openai_base_url={}", toml_string(url)));
            }
            if launch.sandboxed {
                args.push("--dangerously-bypass-approvals-and-sandbox".into());
            } else {
                args.extend(["--sandbox", "workspace-write"].map(str::to_owned));
            }
            args.push("-".into());
        }
    }
    args
}

/// `text` as a TOML basic string (quoted, with `\` and `"` and control characters escaped),
/// as Codex's `-c key=value` parses its value.
fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The process of one agent run: `program` with [`arguments`], the prompt on stdin, in
/// `cwd` (the worktree), with exactly `env` (see [`environment`]).
pub fn command(
    spec: &AgentSpec,
    launch: Launch,
    program: &Path,
    prompt: &str,
    cwd: &Path,
    env: Vec<(String, String)>,
) -> AgentCommand {
    AgentCommand {
        program: PathBuf::from(program),
        args: arguments(spec, launch, &env),
        stdin: prompt.to_owned(),
        cwd: cwd.to_owned(),
        env,
        stop: crate::process::StopTarget::Group,
        pass_fds: Vec::new(),
        user: None,
    }
}

/// Reads an agent's whole output with the parser of its CLI (an [`OutputParser`] fed the
/// text at once). Codex reports tokens only; they are priced for the model the run was
/// launched with.
pub fn parse_output(spec: &AgentSpec, output: &str, prices: &PriceTable) -> RunReport {
    let mut parser = OutputParser::new(spec, prices);
    parser.feed(output.as_bytes());
    parser.finish()
}

/// The longest line of agent output that is read. A longer line is skipped with a warning
/// (it is never held whole in memory): no event agentry needs comes near this size.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Above this capacity the buffer of an unfinished line is freed once the line is read,
/// so one large line does not keep its buffer for the rest of the run.
const KEPT_LINE_CAPACITY: usize = 1024 * 1024;

/// The parser of one agent's output, fed as the output arrives.
///
/// [`OutputParser::feed`] takes the output in chunks of any size, cut anywhere (inside a
/// line or a character); [`OutputParser::finish`] gives the [`RunReport`], the same as the
/// whole output read at once. Each line is read on its own into small typed values holding
/// only what the report needs (the event type, counts, the exact text of money figures, the
/// final text); nothing else of an event is kept. Memory stays bounded: at most one
/// unfinished line (up to [`MAX_LINE_BYTES`]; a longer line is skipped with a warning and
/// not buffered), the final text, and a bounded list of warnings.
///
/// Line by line the parsers read what [`crate::parse_claude`] and [`crate::parse_codex`]
/// document. Lines are numbered from 1; blank lines are passed over; a line that is not a
/// JSON object is skipped with a warning; invalid UTF-8 is read as U+FFFD.
#[derive(Debug)]
pub struct OutputParser {
    lines: Lines,
    /// Warnings about lines that could not be read (listed first, as the whole-text
    /// parsers always did).
    skipped: Warnings,
    /// Warnings about the events read.
    warnings: Warnings,
    reader: Reader,
    /// The most the run may spend (Codex only: Claude Code stops by itself).
    allowance: Option<Usd>,
}

/// The agent-specific part of an [`OutputParser`].
#[derive(Debug)]
enum Reader {
    Claude(ClaudeReader),
    /// Boxed: with its session meter it is much larger than Claude's reader.
    Codex(Box<CodexReader>),
}

impl OutputParser {
    /// The parser of `spec`'s agent; token-only output (Codex) is priced with `prices` for
    /// `spec.model`, and a Codex run's allowance is `spec.max_budget_usd`
    /// ([`OutputParser::allowance_reached`]).
    pub fn new(spec: &AgentSpec, prices: &PriceTable) -> Self {
        match spec.agent_type {
            AgentType::ClaudeCode => Self::claude(),
            AgentType::Codex => {
                Self::codex(&spec.model, prices).with_allowance(spec.max_budget_usd)
            }
        }
    }

    /// This parser also reading what Codex records after every model call in the session
    /// files under `home` (the run's `HOME`; see [`crate::codex_session`]), priced with
    /// `prices`: a Codex run is then priced as it goes, stopped at its allowance within one
    /// model call, and priced when it ends without its final event. No effect on Claude Code.
    pub fn with_codex_home(mut self, home: &Path, prices: &PriceTable) -> Self {
        if let Reader::Codex(reader) = self.reader {
            self.reader = Reader::Codex(Box::new(reader.with_session(home, prices)));
        }
        self
    }

    /// Reads what the agent recorded outside its output since the last poll (Codex's
    /// session files); called periodically while the agent runs.
    pub fn poll(&mut self) {
        if let Reader::Codex(reader) = &mut self.reader {
            reader.poll();
        }
    }

    /// This parser with `allowance` as the most the run may spend. Only a parser that
    /// prices usage as it arrives (Codex) ever reaches it.
    pub fn with_allowance(mut self, allowance: Option<Usd>) -> Self {
        self.allowance = allowance;
        self
    }

    /// The exact priced cost of the usage events read so far (Codex: the tokens of every
    /// complete `turn.completed` line fed, priced for the launched model; a turn counts only
    /// once its event has arrived). `None` when it is not known while the run goes on:
    /// Claude Code reports its cost only in its final event, and an unpriced Codex model
    /// has none.
    pub fn cost_so_far(&self) -> Option<Usd> {
        match &self.reader {
            Reader::Claude(_) => None,
            Reader::Codex(r) => r.cost_so_far(),
        }
    }

    /// Whether the run must be stopped: its [`OutputParser::cost_so_far`] has reached its
    /// allowance. Never for a run without allowance or whose cost is not known as it runs.
    pub fn allowance_reached(&self) -> bool {
        matches!((self.cost_so_far(), self.allowance), (Some(cost), Some(allowance)) if cost >= allowance)
    }

    /// The parser of Claude Code's `stream-json` output.
    pub fn claude() -> Self {
        Self::with(Reader::Claude(ClaudeReader::default()))
    }

    /// The parser of the output of a Codex run launched with `model`, priced with `prices`.
    pub fn codex(model: &str, prices: &PriceTable) -> Self {
        Self::with(Reader::Codex(Box::new(CodexReader::new(model, prices))))
    }

    fn with(reader: Reader) -> Self {
        OutputParser {
            lines: Lines::default(),
            skipped: Warnings::default(),
            warnings: Warnings::default(),
            reader,
            allowance: None,
        }
    }

    /// Reads the next chunk of output.
    pub fn feed(&mut self, bytes: &[u8]) {
        let OutputParser {
            lines,
            skipped,
            warnings,
            reader,
            allowance: _,
        } = self;
        lines.feed(bytes, &mut |line| reader.line(line, skipped, warnings));
    }

    /// The report of everything fed (an unfinished last line is read as a line).
    pub fn finish(self) -> RunReport {
        let OutputParser {
            mut lines,
            mut skipped,
            mut warnings,
            mut reader,
            allowance: _,
        } = self;
        lines.finish(&mut |line| reader.line(line, &mut skipped, &mut warnings));
        let warnings = skipped.then(warnings);
        match reader {
            Reader::Claude(r) => r.finish(warnings),
            Reader::Codex(r) => r.finish(warnings),
        }
    }

    /// The bytes of an unfinished line held in memory (at most [`MAX_LINE_BYTES`]).
    #[cfg(test)]
    fn pending_bytes(&self) -> usize {
        self.lines.pending.capacity()
    }
}

impl Reader {
    /// Reads one line: blank lines are passed over, an over-long one is skipped with a
    /// warning in `skipped`, like one that is not JSON.
    fn line(&mut self, line: Line<'_>, skipped: &mut Warnings, warnings: &mut Warnings) {
        match line {
            Line::TooLong(line_no) => skipped.push(format!(
                "line {line_no}: longer than {MAX_LINE_BYTES} bytes, skipped"
            )),
            Line::Text(line_no, bytes) => {
                let text = String::from_utf8_lossy(bytes);
                let text = text.trim();
                if text.is_empty() {
                    return;
                }
                match self {
                    Reader::Claude(r) => r.line(line_no, text, skipped),
                    Reader::Codex(r) => r.line(line_no, text, skipped, warnings),
                }
            }
        }
    }
}

impl Warnings {
    /// These warnings followed by `later`, kept and counted as if pushed in that order.
    fn then(mut self, later: Warnings) -> Warnings {
        for warning in later.kept {
            self.push(warning);
        }
        self.dropped += later.dropped;
        self
    }
}

/// One line of output, numbered from 1.
enum Line<'a> {
    /// A line (without its `\n`).
    Text(usize, &'a [u8]),
    /// A line longer than [`MAX_LINE_BYTES`], not kept.
    TooLong(usize),
}

/// Cuts a byte stream into lines (`\n`-terminated, the last one possibly not), holding at
/// most one unfinished line of at most [`MAX_LINE_BYTES`].
#[derive(Debug, Default)]
struct Lines {
    /// The start of a line whose end has not arrived yet.
    pending: Vec<u8>,
    /// The current line passed [`MAX_LINE_BYTES`]: the rest of it is dropped.
    too_long: bool,
    /// The number of the last line emitted.
    line_no: usize,
}

impl Lines {
    fn feed(&mut self, mut bytes: &[u8], emit: &mut impl FnMut(Line<'_>)) {
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            let (piece, rest) = (&bytes[..end], &bytes[end + 1..]);
            self.line_no += 1;
            if self.too_long || self.pending.len().saturating_add(piece.len()) > MAX_LINE_BYTES {
                emit(Line::TooLong(self.line_no));
            } else if self.pending.is_empty() {
                emit(Line::Text(self.line_no, piece));
            } else {
                self.push_pending(piece);
                emit(Line::Text(self.line_no, &self.pending));
            }
            self.reset();
            bytes = rest;
        }
        if bytes.is_empty() || self.too_long {
            return;
        }
        if self.pending.len().saturating_add(bytes.len()) > MAX_LINE_BYTES {
            self.too_long = true;
            self.pending = Vec::new();
        } else {
            self.push_pending(bytes);
        }
    }

    /// Appends to the unfinished line (whose length with `bytes` is at most
    /// [`MAX_LINE_BYTES`]), never growing its buffer beyond that.
    fn push_pending(&mut self, bytes: &[u8]) {
        let needed = self.pending.len() + bytes.len();
        if needed > self.pending.capacity() {
            let target = needed
                .max(self.pending.capacity().saturating_mul(2))
                .min(MAX_LINE_BYTES);
            self.pending.reserve_exact(target - self.pending.len());
        }
        self.pending.extend_from_slice(bytes);
    }

    fn finish(&mut self, emit: &mut impl FnMut(Line<'_>)) {
        if self.too_long {
            self.line_no += 1;
            emit(Line::TooLong(self.line_no));
        } else if !self.pending.is_empty() {
            self.line_no += 1;
            emit(Line::Text(self.line_no, &self.pending));
        }
        self.reset();
    }

    /// Ready for the next line.
    fn reset(&mut self) {
        self.too_long = false;
        if self.pending.capacity() > KEPT_LINE_CAPACITY {
            self.pending = Vec::new();
        } else {
            self.pending.clear();
        }
    }
}

// ------------------------------------------------------------ reading one JSON line

/// The top-level fields of an event that a parser reads, filled key by key.
pub(crate) trait Fields: Default {
    /// Reads the value of `key` from `map` if it is wanted, else skips it with [`Skip`].
    /// Called once per key, in order, so of repeated keys the last one counts.
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error>;
}

/// `impl Fields for $ty`: the value of each `"key"` is read into `self.field` by the reader
/// named after it ([`value`], [`object`] or [`present`]); any other key is skipped.
macro_rules! fields {
    ($ty:ty { $($key:literal => $field:tt: $read:ident),* $(,)? }) => {
        impl $crate::agent::Fields for $ty {
            fn field<'de, A: ::serde::de::MapAccess<'de>>(
                &mut self,
                key: &str,
                map: &mut A,
            ) -> Result<(), A::Error> {
                match key {
                    $($key => self.$field = $crate::agent::$read(map)?,)*
                    _ => {
                        map.next_value::<$crate::agent::Skip>()?;
                    }
                }
                Ok(())
            }
        }
    };
}
pub(crate) use fields;

/// A [`fields!`] reader: the value as its own type.
pub(crate) fn value<'de, T: Deserialize<'de>, A: MapAccess<'de>>(
    map: &mut A,
) -> Result<T, A::Error> {
    map.next_value()
}

/// A [`fields!`] reader: the fields `F` if the value is an object, else `None`.
pub(crate) fn object<'de, F: Fields, A: MapAccess<'de>>(
    map: &mut A,
) -> Result<Option<F>, A::Error> {
    Ok(map.next_value::<Object<F>>()?.0)
}

/// A [`fields!`] reader: the value as its own type, `Some` since the key is present.
pub(crate) fn present<'de, T: Deserialize<'de>, A: MapAccess<'de>>(
    map: &mut A,
) -> Result<Option<T>, A::Error> {
    map.next_value().map(Some)
}

/// The fields `F` of one line of output if it is a JSON object. A line that is not JSON or
/// not an object is skipped with a warning quoting it, exactly as a `serde_json::Value`
/// parse would tell them apart (every value is fully checked, none is kept).
pub(crate) fn read_object<F: Fields>(
    line_no: usize,
    line: &str,
    warnings: &mut Warnings,
) -> Option<F> {
    match serde_json::from_str::<Object<F>>(line) {
        Ok(Object(Some(fields))) => Some(fields),
        Ok(Object(None)) => {
            warnings.push(format!("line {line_no}: not a JSON object, skipped"));
            None
        }
        Err(_) => {
            warnings.push(format!(
                "line {line_no}: not JSON, skipped: {}",
                excerpt(line)
            ));
            None
        }
    }
}

/// Any JSON value, read with the same checks as a `serde_json::Value` (numbers in range,
/// valid escapes) but not kept.
pub(crate) struct Skip;

/// A JSON value that is a string if it is one (`Some`), else `None`; any JSON is accepted.
#[derive(Debug, Default)]
pub(crate) struct LooseStr(pub(crate) Option<String>);

/// A JSON value as a token count: `Some` for an integer in `0..=i64::MAX`, else `None`
/// (what `Value::as_i64` then `>= 0` gives); any JSON is accepted.
#[derive(Debug, Default)]
pub(crate) struct Count(pub(crate) Option<i64>);

/// A JSON value: the fields `F` if it is an object, else `None`; any JSON is accepted.
#[derive(Debug)]
pub(crate) struct Object<F>(pub(crate) Option<F>);

/// A JSON value as an HTTP status: `Some` for an integer in `0..=65535`, else `None` (what
/// `Value::as_u64` then `u16::try_from` gives); any JSON is accepted, an array or object
/// skipped without being kept.
#[derive(Debug, Default)]
pub(crate) struct Status(pub(crate) Option<u16>);

/// A JSON value that is a string, an object (its fields `F`), or something else.
#[derive(Debug)]
pub(crate) enum StrOr<F> {
    /// A string.
    Str(String),
    /// An object.
    Object(F),
    /// Any other JSON value.
    Other,
}

/// The `message` string of an object, if it has one.
#[derive(Debug, Default)]
pub(crate) struct Message(pub(crate) LooseStr);

fields!(Message { "message" => 0: value });

/// A map key, borrowed from the line when it has no escapes.
pub(crate) struct Key<'de>(pub(crate) Cow<'de, str>);

/// Reads the rest of a JSON object into the fields `F`.
fn read_fields<'de, F: Fields, A: MapAccess<'de>>(mut map: A) -> Result<F, A::Error> {
    let mut fields = F::default();
    while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
        fields.field(&key, &mut map)?;
    }
    Ok(fields)
}

/// Skips the rest of a JSON array.
fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<Skip>()?.is_some() {}
    Ok(())
}

/// Skips the rest of a JSON object.
fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_key::<Skip>()?.is_some() {
        map.next_value::<Skip>()?;
    }
    Ok(())
}

/// Visitor methods giving `$value`: `visit_unit` when `unit` leads, then each
/// `visit_…(type)` listed, its argument ignored.
macro_rules! visits {
    ($value:expr; unit $(, $method:ident($ty:ty))*) => {
        fn visit_unit<E: ::serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
        $crate::agent::visits!($value; $($method($ty)),*);
    };
    ($value:expr; $($method:ident($ty:ty)),*) => {
        $(
            fn $method<E: ::serde::de::Error>(self, _: $ty) -> Result<Self::Value, E> {
                Ok($value)
            }
        )*
    };
}
pub(crate) use visits;

/// Visitor methods giving `$value` for every JSON scalar but strings.
macro_rules! other_scalars {
    ($value:expr) => {
        $crate::agent::visits!($value; unit, visit_bool(bool), visit_f64(f64));
    };
}
pub(crate) use other_scalars;

/// Visitor methods giving `$value` for integers.
macro_rules! integers {
    ($value:expr) => {
        $crate::agent::visits!($value; visit_i64(i64), visit_u64(u64));
    };
}
pub(crate) use integers;

/// Visitor methods giving `$value` for strings.
macro_rules! strings {
    ($value:expr) => {
        $crate::agent::visits!($value; visit_str(&str));
    };
}
pub(crate) use strings;

/// Visitor methods giving `$value` for every JSON scalar.
macro_rules! scalars {
    ($value:expr) => {
        $crate::agent::other_scalars!($value);
        $crate::agent::integers!($value);
        $crate::agent::strings!($value);
    };
}
pub(crate) use scalars;

/// Visitor methods skipping arrays and objects, giving `$value`.
macro_rules! containers {
    ($value:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            skip_seq(seq)?;
            Ok($value)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            skip_map(map)?;
            Ok($value)
        }
    };
}

/// `Deserialize` for a type that accepts any JSON value: a visitor `V` (a unit struct, or
/// one holding a `PhantomData` of the type parameter) whose `Value` is the type, with the
/// given visitor methods, through `deserialize_any`.
macro_rules! any_json {
    (impl<$($param:ident: $bound:path)?> for $ty:ty, V $(<$p:ident>(PhantomData<$q:ident>))? {
        $($methods:tt)*
    }) => {
        impl<'de, $($param: $bound)?> ::serde::Deserialize<'de> for $ty {
            fn deserialize<D: ::serde::Deserializer<'de>>(
                deserializer: D,
            ) -> Result<Self, D::Error> {
                struct V $(<$p>(::std::marker::PhantomData<$q>))?;
                impl<'de, $($param: $bound)?> ::serde::de::Visitor<'de> for V $(<$p>)? {
                    type Value = $ty;
                    fn expecting(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                        f.write_str("any JSON value")
                    }
                    $($methods)*
                }
                deserializer.deserialize_any(V $((::std::marker::PhantomData::<$p>))?)
            }
        }
    };
}
pub(crate) use any_json;

any_json! {
    impl<> for Skip, V {
        scalars!(Skip);
        containers!(Skip);
    }
}

any_json! {
    impl<> for LooseStr, V {
        fn visit_str<E: de::Error>(self, v: &str) -> Result<LooseStr, E> {
            Ok(LooseStr(Some(v.to_owned())))
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<LooseStr, E> {
            Ok(LooseStr(Some(v)))
        }
        other_scalars!(LooseStr(None));
        integers!(LooseStr(None));
        containers!(LooseStr(None));
    }
}

any_json! {
    impl<> for Count, V {
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
            Ok(Count(Some(v).filter(|n| *n >= 0)))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
            Ok(Count(i64::try_from(v).ok()))
        }
        other_scalars!(Count(None));
        strings!(Count(None));
        containers!(Count(None));
    }
}

any_json! {
    impl<F: Fields> for Object<F>, V<F>(PhantomData<F>) {
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Object<F>, A::Error> {
            Ok(Object(Some(read_fields(map)?)))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Object<F>, A::Error> {
            skip_seq(seq)?;
            Ok(Object(None))
        }
        scalars!(Object(None));
    }
}

any_json! {
    impl<> for Status, V {
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Status, E> {
            Ok(Status(u16::try_from(v).ok()))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Status, E> {
            Ok(Status(u16::try_from(v).ok()))
        }
        other_scalars!(Status(None));
        strings!(Status(None));
        containers!(Status(None));
    }
}

any_json! {
    impl<F: Fields> for StrOr<F>, V<F>(PhantomData<F>) {
        fn visit_str<E: de::Error>(self, v: &str) -> Result<StrOr<F>, E> {
            Ok(StrOr::Str(v.to_owned()))
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<StrOr<F>, E> {
            Ok(StrOr::Str(v))
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StrOr<F>, A::Error> {
            Ok(StrOr::Object(read_fields(map)?))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<StrOr<F>, A::Error> {
            skip_seq(seq)?;
            Ok(StrOr::Other)
        }
        other_scalars!(StrOr::Other);
        integers!(StrOr::Other);
    }
}

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AgentOutcome;

    const SANDBOXED: Launch = Launch {
        sandboxed: true,
        review: false,
    };
    const UNSANDBOXED: Launch = Launch {
        sandboxed: false,
        review: false,
    };

    /// Inside the sandbox Claude Code may run commands (tests, `git diff`); outside it only
    /// edits files, and a review may only read the change with git.
    #[test]
    fn claude_command_line_carries_model_limits_budget_and_permissions() {
        let spec = AgentSpec {
            agent_type: AgentType::ClaudeCode,
            model: "sonnet".into(),
            max_turns: Some(40),
            max_budget_usd: Some(Usd::parse("2.50").unwrap()),
        };
        assert_eq!(
            arguments(&spec, SANDBOXED, &[]).join(" "),
            "-p --output-format stream-json --verbose --model sonnet --max-turns 40 \
             --max-budget-usd 2.5 --permission-mode bypassPermissions"
        );
        assert_eq!(
            arguments(&spec, UNSANDBOXED, &[]).join(" "),
            "-p --output-format stream-json --verbose --model sonnet --max-turns 40 \
             --max-budget-usd 2.5 --permission-mode acceptEdits"
        );
        let review = Launch {
            sandboxed: false,
            review: true,
        };
        assert!(arguments(&spec, review, &[]).join(" ").ends_with(
            "--permission-mode acceptEdits --allowedTools Bash(git diff:*),Bash(git log:*),\
                 Bash(git status:*),Bash(git show:*)"
        ));
        let sandboxed_review = Launch {
            sandboxed: true,
            review: true,
        };
        assert!(
            !arguments(&spec, sandboxed_review, &[])
                .iter()
                .any(|a| a == "--allowedTools")
        );
        let unlimited = AgentSpec {
            max_turns: None,
            max_budget_usd: None,
            ..spec
        };
        assert!(
            !arguments(&unlimited, SANDBOXED, &[])
                .iter()
                .any(|a| a.starts_with("--max"))
        );
    }

    /// Inside agentry's sandbox Codex's own cannot start; outside it, it is Codex's. The
    /// base URL goes through Codex's configuration, quoted as TOML.
    #[test]
    fn codex_command_line_reads_the_prompt_from_stdin() {
        let spec = AgentSpec {
            agent_type: AgentType::Codex,
            model: "gpt-6.1-sol".into(),
            max_turns: Some(40),
            max_budget_usd: None,
        };
        assert_eq!(
            arguments(&spec, SANDBOXED, &[]).join(" "),
            "exec --json --model gpt-6.1-sol --dangerously-bypass-approvals-and-sandbox -"
        );
        assert_eq!(
            arguments(&spec, UNSANDBOXED, &[]).join(" "),
            "exec --json --model gpt-6.1-sol --sandbox workspace-write -"
        );
        let env = [(
            OPENAI_BASE_URL.to_owned(),
            "http://127.0.0.1:9/v1?a=\"b\\".to_owned(),
        )];
        assert_eq!(
            arguments(&spec, SANDBOXED, &env)[4..6],
            [
                "-c".to_owned(),
                "openai_base_url=\"http://127.0.0.1:9/v1?a=\\\"b\\\\\"".to_owned()
            ]
        );
    }

    /// Only `PATH`, `HOME`, the agent's own credentials and the passed variables reach an
    /// agent; Codex's key is `CODEX_API_KEY`; a passed variable replaces nothing of those.
    #[test]
    fn the_agent_environment_is_minimal() {
        let service = ServiceEnv::read(
            &[
                "HTTPS_PROXY".to_owned(),
                "HOME".to_owned(),
                "UNSET".to_owned(),
            ],
            |name| match name {
                "PATH" => Some("/opt/bin:/usr/bin".into()),
                "ANTHROPIC_API_KEY" => Some("sk-ant".into()),
                "OPENAI_API_KEY" => Some("sk-openai".into()),
                "CLAUDE_CODE_OAUTH_TOKEN" => Some(String::new()),
                "HTTPS_PROXY" => Some("http://proxy:3128".into()),
                "HOME" => Some("/root".into()),
                "DATABASE_URL" => Some("postgres://secret".into()),
                _ => None,
            },
        );
        assert!(!format!("{service:?}").contains("sk-"), "{service:?}");
        let env = |agent, launch| -> Vec<String> {
            environment(agent, launch, Path::new("/run/home"), &service)
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        };
        assert_eq!(
            env(AgentType::ClaudeCode, SANDBOXED),
            [
                "PATH=/opt/bin:/usr/bin",
                "HOME=/run/home",
                "ANTHROPIC_API_KEY=sk-ant",
                "DISABLE_AUTOUPDATER=1",
                "DISABLE_ERROR_REPORTING=1",
                "IS_SANDBOX=1",
                "HTTPS_PROXY=http://proxy:3128",
            ]
        );
        assert_eq!(
            env(AgentType::ClaudeCode, UNSANDBOXED),
            [
                "PATH=/opt/bin:/usr/bin",
                "HOME=/run/home",
                "ANTHROPIC_API_KEY=sk-ant",
                "DISABLE_AUTOUPDATER=1",
                "DISABLE_ERROR_REPORTING=1",
                "HTTPS_PROXY=http://proxy:3128",
            ]
        );
        assert_eq!(
            env(AgentType::Codex, SANDBOXED),
            [
                "PATH=/opt/bin:/usr/bin",
                "HOME=/run/home",
                "CODEX_API_KEY=sk-openai",
                "HTTPS_PROXY=http://proxy:3128",
            ]
        );
        let bare = environment(
            AgentType::Codex,
            UNSANDBOXED,
            Path::new("/h"),
            &ServiceEnv::default(),
        );
        assert_eq!(
            bare,
            [
                ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
                ("HOME".to_owned(), "/h".to_owned())
            ]
        );
    }

    /// A line longer than the bound is dropped as it arrives, never held whole, and the
    /// lines after it are read.
    #[test]
    fn an_over_long_line_is_not_buffered() {
        let mut parser = OutputParser::claude();
        parser.feed(b"{\"type\":\"system\",\"subtype\":\"init\",\"model\":\"m\"}\n{\"x\":\"");
        let chunk = vec![b'a'; 64 * 1024];
        let mut fed = 0;
        while fed <= MAX_LINE_BYTES + chunk.len() {
            parser.feed(&chunk);
            fed += chunk.len();
            assert!(
                parser.pending_bytes() <= MAX_LINE_BYTES,
                "{}",
                parser.pending_bytes()
            );
        }
        parser
            .feed(b"\"}\n{\"type\":\"result\",\"subtype\":\"success\",\"total_cost_usd\":0.25}\n");
        assert_eq!(parser.pending_bytes(), 0);
        // The same again, without a final newline.
        parser.feed(&vec![b'b'; MAX_LINE_BYTES + 1]);
        assert_eq!(parser.pending_bytes(), 0);
        let report = parser.finish();
        assert_eq!(report.outcome, AgentOutcome::Success);
        assert_eq!(report.cost_usd, Some(Usd::parse("0.25").unwrap()));
        assert_eq!(report.model.as_deref(), Some("m"));
        assert_eq!(
            report.warnings,
            vec![
                format!("line 2: longer than {MAX_LINE_BYTES} bytes, skipped"),
                format!("line 4: longer than {MAX_LINE_BYTES} bytes, skipped"),
                "the result event has no modelUsage; token counts are unknown".to_owned(),
            ]
        );
    }

    /// A line just under the bound, arriving in pieces, is read whole.
    #[test]
    fn a_long_line_in_pieces_is_read() {
        let text = format!(
            "{{\"type\":\"result\",\"subtype\":\"success\",\"total_cost_usd\":1,\"result\":\"{}\"}}",
            "r".repeat(MAX_LINE_BYTES - 200)
        );
        let mut parser = OutputParser::claude();
        for piece in text.as_bytes().chunks(1 << 20) {
            parser.feed(piece);
        }
        assert!(parser.pending_bytes() <= MAX_LINE_BYTES);
        let report = parser.finish();
        assert_eq!(
            report.final_text.map(|t| t.len()),
            Some(MAX_LINE_BYTES - 200)
        );
    }
}
