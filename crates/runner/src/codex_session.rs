//! What a Codex run spent so far, from the session files Codex writes as it works.
//!
//! `codex exec --json` prints its usage once, at the end (`turn.completed`, every model
//! call summed), and a run that is stopped prints none. But after every model call Codex
//! appends a `token_usage_record` line to its session file
//! (`$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl`, `CODEX_HOME` being `~/.codex` in the
//! run's own `HOME`):
//!
//! ```json
//! {"timestamp":"…","type":"token_usage_record","payload":{"response_id":"resp_…",
//!  "usage":{"input_tokens":3000,"cached_input_tokens":1000,"cache_write_input_tokens":0,
//!  "output_tokens":100,"reasoning_output_tokens":20,"total_tokens":3100},…}}
//! ```
//!
//! A [`SessionMeter`] reads those lines as they are appended (each file from where it
//! stopped; whole lines only), counts each response once (by `response_id`), and prices
//! each call for the model of the file's latest `turn_context` (else the launched model).
//! So a Codex run can be stopped within one model call of its allowance, and a stopped or
//! crashed run still has a cost. Like the stdout stream, the files are written by the agent's
//! own process: they are its word, as every agent-reported cost is until model calls are
//! metered outside the agent.
//!
//! The agent also controls how much it writes there, so the meter's memory is bounded
//! whatever it writes: a digest of each response id (at most 65,536), the state of the
//! files listed at the last poll only, at most 2 MiB of unfinished lines all files
//! together, and at most 8 unpriced model names, each an excerpt.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use agentry_domain::money::Usd;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::agent::Count;
use crate::excerpt;
use crate::files::{EntryKind, OpenDir};
use crate::prices::{PriceTable, Tokens};

/// The most bytes read from the session files in one poll, all files together (the rest is
/// read at the next one). A poll runs on the async runtime, once a second.
const MAX_READ_PER_POLL: u64 = 4 * 1024 * 1024;

/// The longest session line kept whole; a longer one (a huge tool output) is skipped. The
/// lines read here (`token_usage_record`, `turn_context`) are a few KiB at most.
const MAX_LINE_BYTES: usize = 1024 * 1024;

/// The most session files read (the first, in name order: Codex names them by their start
/// time). One `codex exec` writes one; the bound keeps an agent that writes thousands from
/// making each poll, and the partial lines kept between polls, as large.
const MAX_SESSION_FILES: usize = 16;

/// The most directory entries one poll looks at while it lists the session files.
const MAX_LISTED_ENTRIES: usize = 4096;

/// Where Codex writes its session files, relative to the run's `HOME` (`$CODEX_HOME` is
/// `~/.codex`).
const SESSIONS: &str = ".codex/sessions";

/// The most response ids remembered, to count each response once (as 16-byte digests, so
/// about 2 MiB with their order). Codex records one response per model call, and a model
/// call takes seconds: a real run, even one of many hours, records a few thousand, far
/// below this. Beyond it the oldest id is forgotten, so a response recorded again after
/// this many newer ones counts twice: that can only raise the run's figure (stopping a
/// capped run earlier), never lower it, and an agent could raise it anyway by writing
/// larger usage. Refusing to count past the cap instead would let an agent that floods
/// the file with ids stop its own metering. (A sandboxed run is billed from the model
/// gateway's metering, not from these files.)
const MAX_SEEN_RESPONSES: usize = 65_536;

/// The most bytes of unfinished lines kept between polls, all files together: two
/// over-long lines. The lines read here are a few KiB; a line that would take more is
/// skipped like an over-long one.
const MAX_PARTIAL_BYTES: usize = 2 * MAX_LINE_BYTES;

/// The most names of unpriced models remembered (each an excerpt) for the report's
/// sentence; a run uses one or two models.
const MAX_UNPRICED_MODELS: usize = 8;

/// A response id as kept: the first 16 bytes of its SHA-256, whatever the id's length.
type IdDigest = [u8; 16];

/// The usage of the model calls a Codex run's session files show.
#[derive(Debug)]
pub struct SessionMeter {
    /// The run's `HOME`, below which nothing is followed through a symbolic link.
    home: PathBuf,
    launched_model: String,
    prices: PriceTable,
    /// The state of each file listed at the last poll (and of those only).
    files: BTreeMap<PathBuf, FileState>,
    /// The digests of the response ids counted, the latest [`MAX_SEEN_RESPONSES`].
    seen: HashSet<IdDigest>,
    /// The same digests, oldest first.
    seen_order: VecDeque<IdDigest>,
    calls: u64,
    tokens: Tokens,
    /// The priced cost of the calls; `None` once a call's model has no price or a count
    /// could not be priced.
    cost: Option<Usd>,
    /// The models of calls that could not be priced.
    unpriced: Vec<String>,
}

/// How far one session file has been read.
#[derive(Debug, Default)]
struct FileState {
    offset: u64,
    /// The start of a line whose end has not been written yet.
    partial: Vec<u8>,
    /// Skipping the rest of an over-long line.
    skipping: bool,
    /// The model of the latest `turn_context`.
    model: Option<String>,
}

impl SessionMeter {
    /// The meter of a Codex run whose `HOME` is `home`, launched with `model`, priced with
    /// `prices`.
    pub fn new(home: &Path, model: &str, prices: &PriceTable) -> Self {
        SessionMeter {
            home: home.to_path_buf(),
            launched_model: model.to_owned(),
            prices: prices.clone(),
            files: BTreeMap::new(),
            seen: HashSet::new(),
            seen_order: VecDeque::new(),
            calls: 0,
            tokens: Tokens::default(),
            cost: Some(Usd::ZERO),
            unpriced: Vec::new(),
        }
    }

    /// Reads what was appended to the session files since the last poll. Files that cannot
    /// be read are tried again at the next poll; nothing here fails.
    pub fn poll(&mut self) {
        let mut listed = rollout_files(&self.home);
        listed.truncate(MAX_SESSION_FILES);
        // A file no longer listed (renamed, deleted, or pushed out by others) is forgotten;
        // if it comes back it is read from its start, its responses still counted once.
        self.files.retain(|path, _| listed.contains(path));
        let mut budget = MAX_READ_PER_POLL;
        for path in listed {
            if budget == 0 {
                break;
            }
            let others = self
                .files
                .iter()
                .filter(|(p, _)| **p != path)
                .map(|(_, s)| s.partial.len())
                .sum::<usize>();
            let room = MAX_PARTIAL_BYTES.saturating_sub(others).min(MAX_LINE_BYTES);
            let state = self.files.entry(path.clone()).or_default();
            let (lines, read) = read_new_lines(&self.home, &path, state, budget, room);
            budget = budget.saturating_sub(read);
            for line in lines {
                self.line(&path, &line);
            }
        }
    }

    /// The number of model calls seen.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// The tokens of the calls seen.
    pub fn tokens(&self) -> Tokens {
        self.tokens
    }

    /// The exact priced cost of the calls seen (zero before the first); `None` when a
    /// call's model has no price.
    pub fn cost(&self) -> Option<Usd> {
        self.cost
    }

    /// The models seen that have no price.
    pub fn unpriced(&self) -> &[String] {
        &self.unpriced
    }

    fn line(&mut self, path: &Path, line: &[u8]) {
        let is = |needle: &[u8]| line.windows(needle.len()).any(|w| w == needle);
        if is(b"\"turn_context\"") {
            if let Ok(context) = serde_json::from_slice::<Line<TurnContext>>(line)
                && context.kind == "turn_context"
                && let Some(model) = context.payload.model
                && let Some(state) = self.files.get_mut(path)
            {
                state.model = Some(model);
            }
            return;
        }
        if !is(b"\"token_usage_record\"") {
            return;
        }
        let Ok(record) = serde_json::from_slice::<Line<UsageRecord>>(line) else {
            return;
        };
        if record.kind != "token_usage_record" {
            return;
        }
        let Some(usage) = record.payload.usage else {
            return;
        };
        if let Some(id) = record.payload.response_id
            && !self.first_sight(&id)
        {
            return;
        }
        let call = Tokens {
            input: usage.input_tokens.unwrap_or(0),
            cache_read: usage.cached_input_tokens.unwrap_or(0),
            cache_write: usage.cache_write_input_tokens.unwrap_or(0),
            output: usage.output_tokens.unwrap_or(0),
        };
        self.calls += 1;
        self.tokens = self.tokens.saturating_add(call);
        let model = self
            .files
            .get(path)
            .and_then(|s| s.model.clone())
            .unwrap_or_else(|| self.launched_model.clone());
        let priced = self.prices.get(&model).and_then(|price| price.cost(call));
        if priced.is_none() && self.unpriced.len() < MAX_UNPRICED_MODELS {
            let name = excerpt(&model);
            if !self.unpriced.contains(&name) {
                self.unpriced.push(name);
            }
        }
        self.cost = match (self.cost, priced) {
            (Some(total), Some(call)) => total.checked_add(call),
            _ => None,
        };
    }
}

impl SessionMeter {
    /// Whether the response `id` is seen for the first time (of the latest
    /// [`MAX_SEEN_RESPONSES`]); remembers it.
    fn first_sight(&mut self, id: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(id.as_bytes()).into();
        let mut kept = IdDigest::default();
        kept.copy_from_slice(&digest[..size_of::<IdDigest>()]);
        if !self.seen.insert(kept) {
            return false;
        }
        self.seen_order.push_back(kept);
        if self.seen_order.len() > MAX_SEEN_RESPONSES
            && let Some(oldest) = self.seen_order.pop_front()
        {
            self.seen.remove(&oldest);
        }
        true
    }
}

/// A session line: its `type` and `payload`.
#[derive(Deserialize)]
struct Line<P> {
    #[serde(rename = "type")]
    kind: String,
    payload: P,
}

#[derive(Deserialize)]
struct TurnContext {
    model: Option<String>,
}

#[derive(Deserialize)]
struct UsageRecord {
    response_id: Option<String>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default, deserialize_with = "count")]
    input_tokens: Option<i64>,
    #[serde(default, deserialize_with = "count")]
    cached_input_tokens: Option<i64>,
    #[serde(default, deserialize_with = "count")]
    cache_write_input_tokens: Option<i64>,
    #[serde(default, deserialize_with = "count")]
    output_tokens: Option<i64>,
}

/// A non-negative integer, else `None`; any other value is skipped without being kept.
fn count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Ok(Count::deserialize(d)?.0)
}

/// The `rollout-*.jsonl` files under `home`'s [`SESSIONS`] (`YYYY/MM/DD/`), as paths
/// relative to `home`, sorted; of the first [`MAX_LISTED_ENTRIES`] entries looked at.
///
/// The agent owns every directory on the way, and could swap one for a symbolic link to
/// another run's session files: each directory is opened in the one above it without
/// following a link (`.codex`, `sessions` and the date directories alike), and a link
/// listed is neither descended into nor read. The files are opened the same way
/// ([`read_new_lines`]), so a directory swapped for a link after this listing is refused
/// then.
fn rollout_files(home: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(root) = OpenDir::open(home, Path::new(SESSIONS)) else {
        return found;
    };
    // Directories still to list, each with the opened directory it is in. Depth first, so
    // the directories held open are the ancestors of the one listed, never more than its
    // depth (a directory with thousands of subdirectories does not open them all at once).
    let mut stack: Vec<(Rc<OpenDir>, PathBuf, usize)> = Vec::new();
    let mut next = Some((root, PathBuf::from(SESSIONS), 0));
    let mut listed = 0;
    loop {
        let (mut dir, path, depth) = match next.take() {
            Some(opened) => opened,
            None => {
                let Some((parent, path, depth)) = stack.pop() else {
                    break;
                };
                let name = path.file_name().unwrap_or_default();
                let Ok(dir) = parent.subdir(name) else {
                    continue;
                };
                (dir, path, depth)
            }
        };
        let entries = dir.entries(MAX_LISTED_ENTRIES - listed);
        listed += entries.len();
        let dir = Rc::new(dir);
        for (name, kind) in entries {
            match kind {
                EntryKind::Dir if depth < 3 => {
                    stack.push((Rc::clone(&dir), path.join(name), depth + 1));
                }
                EntryKind::File
                    if name
                        .to_str()
                        .is_some_and(|n| n.starts_with("rollout-") && n.ends_with(".jsonl")) =>
                {
                    found.push(path.join(name));
                }
                _ => {}
            }
        }
        if listed >= MAX_LISTED_ENTRIES {
            break;
        }
    }
    found.sort();
    found
}

/// The whole lines appended to the file `relative` below `root` since `state.offset`,
/// reading at most `max` bytes, and
/// how many bytes were read; the start of an unfinished last line is kept for the next read
/// if it fits in `room` bytes, else that line is skipped (as an over-long one is).
fn read_new_lines(
    root: &Path,
    relative: &Path,
    state: &mut FileState,
    max: u64,
    room: usize,
) -> (Vec<Vec<u8>>, u64) {
    let mut bytes = Vec::new();
    // Opened without following a link at any level below `root` or blocking on a FIFO: the
    // agent writes these directories and could swap what was listed for either (this runs
    // on the runtime).
    let read = crate::files::open_regular_beneath(root, relative).and_then(|mut file| {
        let len = file.metadata()?.len();
        if len < state.offset {
            // Truncated or replaced: start over.
            *state = FileState::default();
        }
        file.seek(SeekFrom::Start(state.offset))?;
        file.take(max).read_to_end(&mut bytes)
    });
    let Ok(n) = read else {
        return (Vec::new(), 0);
    };
    state.offset += n as u64;
    let mut lines = Vec::new();
    let mut rest: &[u8] = &bytes;
    while let Some(end) = rest.iter().position(|b| *b == b'\n') {
        let (piece, after) = (&rest[..end], &rest[end + 1..]);
        if state.skipping {
            state.skipping = false;
        } else {
            let mut line = std::mem::take(&mut state.partial);
            line.extend_from_slice(piece);
            lines.push(line);
        }
        rest = after;
    }
    if !state.skipping {
        if state.partial.len() + rest.len() > room {
            state.partial = Vec::new();
            state.skipping = true;
        } else {
            state.partial.extend_from_slice(rest);
        }
    }
    (lines, n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn record(id: &str, input: i64, cached: i64, written: i64, output: i64) -> String {
        format!(
            r#"{{"timestamp":"t","type":"token_usage_record","payload":{{"response_id":"{id}","usage":{{"input_tokens":{input},"cached_input_tokens":{cached},"cache_write_input_tokens":{written},"output_tokens":{output},"reasoning_output_tokens":7,"total_tokens":1}}}}}}"#
        )
    }

    /// A session file the agent swapped, after it was listed, for a FIFO (whose plain open
    /// would block the runtime thread for ever) or for a link to a file of the service's:
    /// neither is read.
    #[test]
    fn a_swapped_session_file_is_never_followed_nor_waited_on() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".codex/sessions/2026/11/25");
        std::fs::create_dir_all(&dir).unwrap();
        let outside = home.path().join("service-file");
        std::fs::write(&outside, format!("{}\n", record("resp_x", 10, 0, 0, 1))).unwrap();
        let link = dir.join("rollout-link.jsonl");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let fifo = dir.join("rollout-fifo.jsonl");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();

        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut state = FileState::default();
            let mut read = |name: &str| {
                let (lines, _) = read_new_lines(
                    &dir,
                    Path::new(name),
                    &mut state,
                    MAX_READ_PER_POLL,
                    MAX_LINE_BYTES,
                );
                lines
            };
            let from_fifo = read("rollout-fifo.jsonl");
            let from_link = read("rollout-link.jsonl");
            let _ = done.send((from_fifo, from_link, state.offset));
        });
        let (from_fifo, from_link, offset) = finished
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("reading a FIFO blocked");
        assert!(from_fifo.is_empty() && from_link.is_empty());
        assert_eq!(offset, 0);
    }

    #[test]
    fn calls_are_read_as_they_are_appended_and_priced_once_each() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".codex/sessions/2026/11/25");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rollout-2026-11-25T21-27-44-x.jsonl");
        let mut file = std::fs::File::create(&path).unwrap();
        let prices = PriceTable::builtin();
        let mut meter = SessionMeter::new(home.path(), "gpt-5.5", &prices);
        meter.poll();
        assert_eq!((meter.calls(), meter.cost()), (0, Some(Usd::ZERO)));

        writeln!(
            file,
            r#"{{"type":"turn_context","payload":{{"model":"gpt-6.1-sol"}}}}"#
        )
        .unwrap();
        let first = record("resp_1", 3000, 1000, 0, 100);
        // Half a line: nothing yet.
        file.write_all(&first.as_bytes()[..40]).unwrap();
        meter.poll();
        assert_eq!(meter.calls(), 0);
        writeln!(file, "{}", &first[40..]).unwrap();
        meter.poll();
        assert_eq!(meter.calls(), 1);
        // gpt-6.1-sol: 2000·2 + 1000·0.1 + 100·10 = 5100 µ$.
        assert_eq!(meter.cost(), Some(Usd::parse("0.0051").unwrap()));
        // The same response again (a rewrite) counts once; noise is ignored.
        writeln!(file, "{first}").unwrap();
        writeln!(file, "not json").unwrap();
        writeln!(
            file,
            r#"{{"type":"event_msg","payload":{{"type":"token_count"}}}}"#
        )
        .unwrap();
        writeln!(file, "{}", record("resp_2", 500, 200, 30, 60)).unwrap();
        meter.poll();
        assert_eq!(meter.calls(), 2);
        assert_eq!(
            meter.tokens(),
            Tokens {
                input: 3500,
                cache_read: 1200,
                cache_write: 30,
                output: 160
            }
        );
        // + 270·2 + 200·0.1 + 30·2.5 + 60·10 = 1235 µ$.
        assert_eq!(meter.cost(), Some(Usd::parse("0.006335").unwrap()));
    }

    /// An agent that writes many session files, or long lines that never end, costs each
    /// poll a bounded read and the meter a bounded memory: the first files in name order
    /// are read, within one read budget per poll, and a line longer than the limit is
    /// skipped while the lines after it still count.
    #[test]
    fn many_files_and_endless_lines_are_read_within_bounds() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".codex/sessions/2026/01/02");
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..MAX_SESSION_FILES + 4 {
            std::fs::write(
                dir.join(format!("rollout-{i:03}.jsonl")),
                format!("{}\n", record(&format!("r{i}"), 10, 0, 0, 1)),
            )
            .unwrap();
        }
        let mut meter = SessionMeter::new(home.path(), "gpt-5.5", &PriceTable::builtin());
        meter.poll();
        assert_eq!(meter.calls(), MAX_SESSION_FILES as u64);
        assert_eq!(meter.files.len(), MAX_SESSION_FILES);

        // One file with a line longer than the limit, then a record: the long line is
        // skipped, never kept whole, and the record after it counts.
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".codex/sessions/2026/01/03");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rollout-a.jsonl");
        let mut file = std::fs::File::create(&path).unwrap();
        let mut meter = SessionMeter::new(home.path(), "gpt-5.5", &PriceTable::builtin());
        let chunk = vec![b'x'; MAX_LINE_BYTES / 2 + 1];
        for _ in 0..3 {
            file.write_all(&chunk).unwrap();
            meter.poll();
            let kept = meter.files.values().map(|s| s.partial.len()).sum::<usize>();
            assert!(kept <= MAX_LINE_BYTES, "{kept} bytes kept");
        }
        writeln!(file).unwrap();
        writeln!(file, "{}", record("after", 10, 0, 0, 1)).unwrap();
        meter.poll();
        assert_eq!(meter.calls(), 1);

        // A poll reads at most its budget, whatever the files hold; the rest comes next.
        let mut state = FileState::default();
        let big = dir.join("rollout-b.jsonl");
        std::fs::write(&big, vec![b'\n'; 10_000]).unwrap();
        let mut read = |budget| {
            let (lines, read) = read_new_lines(
                &dir,
                Path::new("rollout-b.jsonl"),
                &mut state,
                budget,
                MAX_LINE_BYTES,
            );
            (lines.len(), read)
        };
        assert_eq!(read(4_000), (4_000, 4_000));
        assert_eq!(read(100_000), (6_000, 6_000));
    }

    /// An agent that writes endless distinct response ids, keeps renaming its session files
    /// or leaves a long unfinished line in each costs the meter a bounded memory: the ids
    /// kept are capped (the oldest forgotten), only the files listed now keep a state, and
    /// the unfinished lines kept between polls are bounded all files together.
    #[test]
    fn ids_renamed_files_and_unfinished_lines_are_kept_within_bounds() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".codex/sessions/2026/01/04");
        std::fs::create_dir_all(&dir).unwrap();
        let mut meter = SessionMeter::new(home.path(), "gpt-5.5", &PriceTable::builtin());

        // Distinct ids beyond the cap: each call counts, the ids kept stay capped.
        let extra = 10;
        let mut text = String::new();
        for i in 0..MAX_SEEN_RESPONSES + extra {
            text.push_str(&record(&format!("resp_{i}"), 1, 0, 0, 1));
            text.push('\n');
        }
        std::fs::write(dir.join("rollout-a.jsonl"), &text).unwrap();
        for _ in 0..text.len() / MAX_READ_PER_POLL as usize + 1 {
            meter.poll();
        }
        assert_eq!(meter.calls(), (MAX_SEEN_RESPONSES + extra) as u64);
        assert!(
            meter.seen.len() <= MAX_SEEN_RESPONSES,
            "{} ids kept",
            meter.seen.len()
        );
        assert!(meter.seen_order.len() <= MAX_SEEN_RESPONSES);
        // The oldest ids were forgotten: recorded again, the first counts again (the figure
        // can only rise); a recent one still counts once.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("rollout-a.jsonl"))
            .unwrap();
        writeln!(file, "{}", record("resp_0", 1, 0, 0, 1)).unwrap();
        let latest = format!("resp_{}", MAX_SEEN_RESPONSES + extra - 1);
        writeln!(file, "{}", record(&latest, 1, 0, 0, 1)).unwrap();
        meter.poll();
        assert_eq!(meter.calls(), (MAX_SEEN_RESPONSES + extra + 1) as u64);
        std::fs::remove_file(dir.join("rollout-a.jsonl")).unwrap();

        // Files renamed at every poll: only the files listed now keep a state.
        let path = dir.join("rollout-b.jsonl");
        std::fs::write(&path, "{").unwrap();
        for i in 0..3 * MAX_SESSION_FILES {
            meter.poll();
            let renamed = dir.join(format!("rollout-b{i:03}.jsonl"));
            std::fs::rename(
                dir.join(if i == 0 {
                    "rollout-b.jsonl".to_owned()
                } else {
                    format!("rollout-b{:03}.jsonl", i - 1)
                }),
                &renamed,
            )
            .unwrap();
        }
        meter.poll();
        assert_eq!(meter.files.len(), 1);

        // An unfinished line of almost the line limit in each of the files read: the bytes
        // kept between polls stay within the bound of all files together.
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".codex/sessions/2026/01/05");
        std::fs::create_dir_all(&dir).unwrap();
        let mut meter = SessionMeter::new(home.path(), "gpt-5.5", &PriceTable::builtin());
        for i in 0..MAX_SESSION_FILES {
            std::fs::write(
                dir.join(format!("rollout-{i:03}.jsonl")),
                vec![b'x'; MAX_LINE_BYTES - 1],
            )
            .unwrap();
        }
        for _ in 0..MAX_SESSION_FILES {
            meter.poll();
        }
        let kept = meter.files.values().map(|s| s.partial.len()).sum::<usize>();
        assert!(kept <= MAX_PARTIAL_BYTES, "{kept} bytes kept");
    }

    /// An agent that replaces `~/.codex`, `~/.codex/sessions` or a date directory with a
    /// symbolic link to session files outside its `HOME` (another run's) gets none of them
    /// read: no directory below the run's `HOME` is followed through a link.
    #[test]
    fn session_directories_replaced_by_links_are_not_followed() {
        let outside = tempfile::tempdir().unwrap();
        let other = outside.path().join("other-run/.codex/sessions");
        std::fs::create_dir_all(other.join("2026/01/02")).unwrap();
        std::fs::write(
            other.join("2026/01/02/rollout-a.jsonl"),
            format!("{}\n", record("theirs", 10, 0, 0, 1)),
        )
        .unwrap();
        let count = |home: &Path| {
            let mut meter = SessionMeter::new(home, "gpt-5.5", &PriceTable::builtin());
            meter.poll();
            meter.calls()
        };

        // The honest layout is read (the same files, reached without a link).
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(home.path().join(".codex")).unwrap();
        std::fs::rename(&other, home.path().join(".codex/sessions")).unwrap();
        assert_eq!(count(home.path()), 1);
        std::fs::rename(home.path().join(".codex/sessions"), &other).unwrap();

        // `~/.codex` a link.
        let home = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("other-run/.codex"),
            home.path().join(".codex"),
        )
        .unwrap();
        assert_eq!(count(home.path()), 0);

        // `~/.codex/sessions` a link.
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".codex")).unwrap();
        std::os::unix::fs::symlink(&other, home.path().join(".codex/sessions")).unwrap();
        assert_eq!(count(home.path()), 0);

        // A date directory a link.
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(home.path().join(".codex/sessions/2026/01")).unwrap();
        std::os::unix::fs::symlink(
            other.join("2026/01/02"),
            home.path().join(".codex/sessions/2026/01/02"),
        )
        .unwrap();
        assert_eq!(count(home.path()), 0);
    }

    /// Listing the session directory looks at a bounded number of entries, however many
    /// the agent created.
    #[test]
    fn the_listing_stops_at_its_entry_limit() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".codex/sessions");
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..=MAX_LISTED_ENTRIES {
            std::fs::File::create(dir.join(format!("rollout-{i:05}.jsonl"))).unwrap();
        }
        assert_eq!(rollout_files(home.path()).len(), MAX_LISTED_ENTRIES);
    }

    /// A session that names many unpriced models, each a long name, leaves the meter a few
    /// short names to report.
    #[test]
    fn unpriced_models_are_remembered_few_and_short() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".codex/sessions/2026/01/02");
        std::fs::create_dir_all(&dir).unwrap();
        let mut text = String::new();
        for i in 0..3 * MAX_UNPRICED_MODELS {
            let model = format!("{i}-{}", "m".repeat(10_000));
            text.push_str(&format!(
                "{{\"type\":\"turn_context\",\"payload\":{{\"model\":\"{model}\"}}}}\n{}\n",
                record(&format!("r{i}"), 10, 0, 0, 1)
            ));
        }
        std::fs::write(dir.join("rollout-a.jsonl"), text).unwrap();
        let mut meter = SessionMeter::new(home.path(), "gpt-5.5", &PriceTable::builtin());
        meter.poll();
        assert_eq!(meter.calls(), 3 * MAX_UNPRICED_MODELS as u64);
        assert_eq!(meter.cost(), None);
        assert_eq!(meter.unpriced().len(), MAX_UNPRICED_MODELS);
        assert!(meter.unpriced().iter().all(|m| m.chars().count() <= 201));
    }

    #[test]
    fn an_unpriced_model_has_no_cost() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".codex/sessions/2026/01/02");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("rollout-a.jsonl"),
            format!("{}\n", record("r", 10, 0, 0, 1)),
        )
        .unwrap();
        let mut meter = SessionMeter::new(home.path(), "in-house", &PriceTable::builtin());
        meter.poll();
        assert_eq!(meter.calls(), 1);
        assert_eq!(meter.cost(), None);
        assert_eq!(meter.unpriced(), ["in-house"]);
    }
}
