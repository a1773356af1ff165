//! The end of a soak: what "quiet" means, and every assertion, each violation named.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use agentry_fake_github::{FakeGitHub, PullState};
use rust_decimal::{Decimal, RoundingStrategy};
use serde::Deserialize;
use serde_json::Value;

use crate::agent::Entry;
use crate::cluster::{Api, Kill, On5xx};

/// The service's label.
const LABEL: &str = "agentry";
/// The start of the marker of agentry's issue comment.
const COMMENT_MARKER: &str = "<!-- agentry:task:";
/// The start of the marker of a posted review.
const REVIEW_MARKER: &str = "<!-- agentry:review:";
/// The error of a task whose runner died in each of its attempts (contract §2.2).
const DIED_EACH_TIME: &str = "the runner died during each of";

/// A task as `GET /api/tasks` lists it (the members the checks read).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRow {
    /// Id.
    pub id: String,
    /// `coding` or `review`.
    pub task_type: String,
    /// State.
    pub state: String,
    /// The linked issue.
    #[serde(rename = "issueNumber")]
    pub issue: Option<u64>,
    /// The pull request.
    #[serde(rename = "prNumber")]
    pub pr: Option<u64>,
    /// A review task's coding task.
    #[serde(rename = "parentTaskId")]
    pub parent: Option<String>,
    /// The recorded cost (an exact decimal string).
    #[serde(rename = "costUsd", with = "rust_decimal::serde::str_option")]
    pub cost: Option<Decimal>,
    /// Why it failed.
    #[serde(rename = "errorMessage")]
    pub error: Option<String>,
}

fn decimal(v: &Value) -> Result<Option<Decimal>, String> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Decimal::from_str(s)
            .map(Some)
            .map_err(|e| format!("{s:?}: {e}")),
        // A JSON number of the report: its shortest text is the exact decimal it was made from.
        Value::Number(n) => Decimal::from_str(&n.to_string())
            .or_else(|_| Decimal::from_scientific(&n.to_string()))
            .map(Some)
            .map_err(|e| format!("{n}: {e}")),
        other => Err(format!("not a decimal: {other}")),
    }
}

/// Every task, through the list's pages.
pub fn tasks(api: &Api) -> Result<Vec<TaskRow>, String> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0.. {
        let path = match &cursor {
            None => "/api/tasks?limit=200".to_owned(),
            Some(c) => format!("/api/tasks?limit=200&cursor={c}"),
        };
        let a = api.call("GET", &path, None, page, On5xx::Retry)?;
        if a.status != 200 {
            return Err(format!("GET {path}: {} {}", a.status, a.body));
        }
        let page: Vec<TaskRow> = serde_json::from_value(a.body["tasks"].clone())
            .map_err(|e| format!("GET {path}: the tasks: {e}"))?;
        out.extend(page);
        match a.body["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    Ok(out)
}

/// What the world looks like now.
#[derive(Debug)]
pub struct Snapshot {
    /// Every task.
    pub tasks: Vec<TaskRow>,
    /// The fake's pull requests.
    pub pulls: Vec<PullState>,
}

/// The fixed facts of the run the checks compare against.
#[derive(Debug)]
pub struct World<'a> {
    /// The fake code host.
    pub fake: &'a FakeGitHub,
    /// The API.
    pub api: &'a Api,
    /// The repository's owner and name on the fake.
    pub repo: (&'a str, &'a str),
    /// The issues the soak assigned or labelled.
    pub issues: Vec<u64>,
}

impl World<'_> {
    /// The tasks and pull requests now.
    pub fn snapshot(&self) -> Result<Snapshot, String> {
        Ok(Snapshot {
            tasks: tasks(self.api)?,
            pulls: self.fake.pulls(self.repo.0, self.repo.1),
        })
    }

    /// Why the system is not quiet yet (empty: quiet).
    pub fn pending(&self, snap: &Snapshot) -> Vec<String> {
        let mut out = Vec::new();
        let mut count = |what: &str, n: usize| {
            if n > 0 {
                out.push(format!("{n} {what}"));
            }
        };
        let active = |s: &str| matches!(s, "queued" | "provisioning" | "running");
        count(
            "tasks queued, provisioning or running",
            snap.tasks.iter().filter(|t| active(&t.state)).count(),
        );
        count(
            "coding tasks in pr_opened",
            snap.tasks.iter().filter(|t| t.state == "pr_opened").count(),
        );
        count(
            "open pull requests",
            snap.pulls.iter().filter(|p| p.state == "open").count(),
        );
        let linked: BTreeMap<u64, &TaskRow> = snap
            .tasks
            .iter()
            .filter_map(|t| t.issue.map(|n| (n, t)))
            .collect();
        count(
            "issues without a task",
            self.issues
                .iter()
                .filter(|n| !linked.contains_key(n))
                .count(),
        );
        let (mut unmarked, mut open) = (0, 0);
        for (n, t) in &linked {
            let Some(issue) = self.fake.issue(self.repo.0, self.repo.1, *n) else {
                continue;
            };
            let labelled = issue.labels.iter().any(|(l, _)| l == LABEL);
            let commented = issue
                .comments
                .iter()
                .any(|c| c.body.contains(COMMENT_MARKER));
            if !labelled || !commented {
                unmarked += 1;
            }
            if t.state == "completed" && issue.state == "open" {
                open += 1;
            }
        }
        count("issues without their label or comment yet", unmarked);
        count("merged issues still open", open);
        out
    }
}

/// What the checks found.
#[derive(Debug, Default)]
pub struct Findings {
    /// Something done twice.
    pub duplicates: Vec<String>,
    /// Something that should exist and does not (a task, an effect, a cost).
    pub lost: Vec<String>,
    /// A task left in a state it should have left.
    pub stuck: Vec<String>,
    /// Anything else wrong.
    pub other: Vec<String>,
    /// Facts worth printing that are not violations.
    pub notes: Vec<String>,
    /// Figures for the summary.
    pub figures: Vec<(String, String)>,
}

impl Findings {
    /// Whether nothing is wrong.
    pub fn clean(&self) -> bool {
        self.duplicates.is_empty()
            && self.lost.is_empty()
            && self.stuck.is_empty()
            && self.other.is_empty()
    }
}

/// A run as the task detail lists it.
#[derive(Debug, Clone)]
/// A run as `GET /api/tasks/{id}` shows it (the members the checks read).
#[derive(Deserialize)]
struct RunRow {
    attempt: i64,
    #[serde(rename = "costUsd", with = "rust_decimal::serde::str_option")]
    cost: Option<Decimal>,
    outcome: String,
}

fn branch_of(task_id: &str) -> String {
    format!("agentry/task-{}", task_id.replace('-', ""))
}

/// How many times an issue was closed, from the requests on it (`GET`/`PATCH` of
/// `…/issues/{n}`, oldest first): the close is a `PATCH` that took effect (answered 200, or
/// 502, the fault that answers after the effect). A `PATCH` right after a failed one is the
/// client resending the same request; any other `PATCH` starts a delivery of the close. The
/// count is the delivery that first closed the issue plus every delivery after it: a
/// delivery that reads the issue first finds it closed and sends nothing, so a second close
/// is a delivery that closed blindly.
fn close_deliveries<'a>(requests: impl Iterator<Item = (&'a str, u16)>) -> usize {
    let mut closes = 0;
    let mut closed = false;
    let mut previous_failed_patch = false;
    for (method, status) in requests {
        let patch = method == "PATCH";
        if patch && !previous_failed_patch && closed {
            closes += 1;
        }
        if patch && !closed && (status == 200 || status == 502) {
            closed = true;
            closes += 1;
        }
        previous_failed_patch = patch && status != 200;
    }
    closes
}

/// Every assertion of the soak (docs/soak.md).
pub fn verify(
    world: &World<'_>,
    snap: &Snapshot,
    ledger: &BTreeMap<(String, i64), Vec<Entry>>,
    kills: &[Kill],
) -> Result<Findings, String> {
    let mut f = Findings::default();
    let by_id: BTreeMap<&str, &TaskRow> = snap.tasks.iter().map(|t| (t.id.as_str(), t)).collect();
    let coding: Vec<&TaskRow> = snap
        .tasks
        .iter()
        .filter(|t| t.task_type == "coding")
        .collect();
    let reviews: Vec<&TaskRow> = snap
        .tasks
        .iter()
        .filter(|t| t.task_type == "review")
        .collect();
    let per_issue = check_one_task_per_issue(world, &coding, &mut f);
    let died_thrice = check_states(snap, &mut f);
    let pulls = check_pull_requests(snap, &coding, &mut f);
    check_issues(world, &per_issue, &pulls.merged_issues, &mut f);
    check_reviews(world, &by_id, &reviews, &coding, &pulls.by_branch, &mut f);
    let runs = runs_matching_task_costs(world, snap, &mut f)?;
    let (recorded_runs, costless_runs) = check_runs_against_ledger(&runs, ledger, &mut f);
    let (excused, ledger_lines) = check_ledger_against_runs(ledger, &runs, kills, &mut f);
    let (total, costed) = check_cost_report(world, snap, &mut f)?;
    let merged_pulls = pulls.merged;
    let states = |kind: &str| {
        let mut by: BTreeMap<&str, usize> = BTreeMap::new();
        for t in snap.tasks.iter().filter(|t| t.task_type == kind) {
            *by.entry(t.state.as_str()).or_default() += 1;
        }
        by.iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    f.figures.push((
        "tasks".into(),
        format!(
            "{} ({} coding: {}; {} review: {})",
            snap.tasks.len(),
            coding.len(),
            states("coding"),
            reviews.len(),
            states("review")
        ),
    ));
    f.figures.push((
        "pull requests".into(),
        format!("{} opened, {merged_pulls} merged", snap.pulls.len()),
    ));
    f.figures.push((
        "agent runs".into(),
        format!(
            "{ledger_lines} agents reported a cost; {recorded_runs} runs recorded ({costless_runs} without a cost: stopped before their result); {excused} reported costs excused (the replica died before the result reached it); {died_thrice} tasks failed after 3 killed attempts"
        ),
    ));
    f.figures.push((
        "recorded cost".into(),
        format!("${total} over {} costed tasks", costed),
    ));
    Ok(f)
}

/// One coding task per issue, none without one; gives the coding tasks by issue.
fn check_one_task_per_issue<'a>(
    world: &World<'_>,
    coding: &[&'a TaskRow],
    f: &mut Findings,
) -> BTreeMap<u64, Vec<&'a TaskRow>> {
    let mut per_issue: BTreeMap<u64, Vec<&TaskRow>> = BTreeMap::new();
    for t in coding {
        match t.issue {
            Some(n) => per_issue.entry(n).or_default().push(*t),
            None => f.other.push(format!("coding task {} has no issue", t.id)),
        }
    }
    for n in &world.issues {
        match per_issue.get(n).map_or(0, Vec::len) {
            0 => f.lost.push(format!("issue #{n}: no task was created")),
            1 => {}
            k => f.duplicates.push(format!("issue #{n}: {k} coding tasks")),
        }
    }

    per_issue
}

/// No task left in a running state, none failed or cancelled but those the contract fails
/// after three killed attempts; gives how many of those there are.
fn check_states(snap: &Snapshot, f: &mut Findings) -> usize {
    let mut died_thrice = 0;
    for t in &snap.tasks {
        match t.state.as_str() {
            "queued" | "provisioning" | "running" => f
                .stuck
                .push(format!("{} task {} left in {}", t.task_type, t.id, t.state)),
            "failed"
                if t.error
                    .as_deref()
                    .is_some_and(|e| e.starts_with(DIED_EACH_TIME)) =>
            {
                died_thrice += 1;
                f.notes.push(format!(
                    "{} task {} failed as the contract says after its runner was killed in each of its 3 attempts",
                    t.task_type, t.id
                ));
            }
            "failed" | "cancelled" => f.other.push(format!(
                "{} task {} ended {}: {}",
                t.task_type,
                t.id,
                t.state,
                t.error.as_deref().unwrap_or("(no error message)")
            )),
            _ => {}
        }
    }

    died_thrice
}

/// The pull requests on the code host, by branch, and what was merged.
struct Pulls<'a> {
    /// Each branch's pull requests.
    by_branch: BTreeMap<&'a str, Vec<&'a PullState>>,
    /// The issues whose pull request was merged.
    merged_issues: BTreeSet<u64>,
    /// How many pull requests were merged.
    merged: usize,
}

/// Pull requests: one per coding task that opened one, on its branch, in the state the task
/// says.
fn check_pull_requests<'a>(snap: &'a Snapshot, coding: &[&TaskRow], f: &mut Findings) -> Pulls<'a> {
    let mut pulls_by_branch: BTreeMap<&str, Vec<&PullState>> = BTreeMap::new();
    for p in &snap.pulls {
        pulls_by_branch.entry(p.head.as_str()).or_default().push(p);
    }
    let coding_by_branch: BTreeMap<String, &TaskRow> =
        coding.iter().map(|t| (branch_of(&t.id), *t)).collect();
    for (branch, pulls) in &pulls_by_branch {
        if !coding_by_branch.contains_key(*branch) {
            f.other.push(format!(
                "pull request #{} is on {branch}, which no coding task has",
                pulls[0].number
            ));
        }
        if pulls.len() > 1 {
            let numbers: Vec<String> = pulls.iter().map(|p| format!("#{}", p.number)).collect();
            f.duplicates.push(format!(
                "{} pull requests for {branch}: {}",
                pulls.len(),
                numbers.join(", ")
            ));
        }
    }
    let mut merged_issues = BTreeSet::new();
    let mut merged_pulls = 0;
    for t in coding {
        let pulls = pulls_by_branch
            .get(branch_of(&t.id).as_str())
            .cloned()
            .unwrap_or_default();
        let pull = pulls.first();
        match (t.state.as_str(), pull) {
            ("completed", Some(p)) if p.merged => {}
            ("pr_opened", Some(p)) if p.merged => f.stuck.push(format!(
                "coding task {} is pr_opened, but pull request #{} was merged",
                t.id, p.number
            )),
            ("pr_opened", Some(p)) => f.stuck.push(format!(
                "coding task {}: pull request #{} was still open at the end",
                t.id, p.number
            )),
            ("completed" | "pr_opened", _) => f.lost.push(format!(
                "coding task {} is {} without a merged pull request on its branch",
                t.id, t.state
            )),
            ("failed", Some(p)) => f.other.push(format!(
                "coding task {} failed, yet pull request #{} was opened for it",
                t.id, p.number
            )),
            _ => {}
        }
        if let (Some(p), Some(n)) = (pull, t.pr)
            && p.number != n
        {
            f.other.push(format!(
                "coding task {} records pull request #{n}, its branch has #{}",
                t.id, p.number
            ));
        }
        if let (Some(p), Some(issue)) = (pull, t.issue) {
            let closes = format!("Closes #{issue}");
            if !p.body.as_deref().is_some_and(|b| b.contains(&closes)) {
                f.other
                    .push(format!("pull request #{} does not say {closes}", p.number));
            }
            if p.merged {
                merged_pulls += 1;
                merged_issues.insert(issue);
            }
        }
    }

    Pulls {
        by_branch: pulls_by_branch,
        merged_issues,
        merged: merged_pulls,
    }
}

/// One label and one comment per issue; merged issues closed exactly once.
fn check_issues(
    world: &World<'_>,
    per_issue: &BTreeMap<u64, Vec<&TaskRow>>,
    merged_issues: &BTreeSet<u64>,
    f: &mut Findings,
) {
    let (owner, name) = world.repo;
    let requests = world.fake.requests();
    for (n, ts) in per_issue {
        let Some(issue) = world.fake.issue(owner, name, *n) else {
            f.other.push(format!("issue #{n} is not on the code host"));
            continue;
        };
        let labels = issue.labels.iter().filter(|(l, _)| l == LABEL).count();
        match labels {
            1 => {}
            0 => f
                .lost
                .push(format!("issue #{n}: the {LABEL} label was never added")),
            k => f
                .duplicates
                .push(format!("issue #{n}: the {LABEL} label {k} times")),
        }
        let comments: Vec<&str> = issue
            .comments
            .iter()
            .filter(|c| c.body.contains(COMMENT_MARKER))
            .map(|c| c.body.as_str())
            .collect();
        match comments.len() {
            0 => f
                .lost
                .push(format!("issue #{n}: agentry's comment was never posted")),
            1 => {
                if !ts.iter().any(|t| comments[0].contains(&t.id)) {
                    f.other
                        .push(format!("issue #{n}: the comment names another task"));
                }
            }
            k => f
                .duplicates
                .push(format!("issue #{n}: {k} agentry comments")),
        }
        let path = format!("/repos/{owner}/{name}/issues/{n}");
        let closes = close_deliveries(
            requests
                .iter()
                .filter(|r| r.path == path && (r.method == "GET" || r.method == "PATCH"))
                .map(|r| (r.method.as_str(), r.status)),
        );
        let merged = merged_issues.contains(n);
        match (merged, closes, issue.state.as_str()) {
            (true, 1, "closed") | (false, 0, "open") => {}
            (true, 0, _) | (true, _, "open") => {
                f.lost.push(format!("issue #{n}: merged, but not closed"));
            }
            (true, k, _) => f.duplicates.push(format!("issue #{n}: closed {k} times")),
            (false, k, state) => f.other.push(format!(
                "issue #{n}: not merged, yet {state} after {k} closing requests"
            )),
        }
    }
}

/// One review task per coding task that opened its pull request, and one review on it.
fn check_reviews(
    world: &World<'_>,
    by_id: &BTreeMap<&str, &TaskRow>,
    reviews: &[&TaskRow],
    coding: &[&TaskRow],
    pulls_by_branch: &BTreeMap<&str, Vec<&PullState>>,
    f: &mut Findings,
) {
    let (owner, name) = world.repo;
    let mut review_tasks: BTreeMap<&str, Vec<&TaskRow>> = BTreeMap::new();
    for r in reviews {
        match r.parent.as_deref() {
            Some(p) if by_id.contains_key(p) => review_tasks.entry(p).or_default().push(*r),
            _ => f
                .other
                .push(format!("review task {} has no coding task", r.id)),
        }
    }
    for t in coding {
        let Some(pull) = pulls_by_branch
            .get(branch_of(&t.id).as_str())
            .and_then(|p| p.first())
        else {
            continue;
        };
        let rts = review_tasks.get(t.id.as_str()).cloned().unwrap_or_default();
        match rts.len() {
            1 => {}
            0 => f.lost.push(format!("coding task {}: no review task", t.id)),
            k => f
                .duplicates
                .push(format!("coding task {}: {k} review tasks", t.id)),
        }
        let bodies = world.fake.reviews(owner, name, pull.number);
        let marked: Vec<&String> = bodies
            .iter()
            .filter(|b| b.contains(REVIEW_MARKER))
            .collect();
        if marked.len() > 1 {
            f.duplicates.push(format!(
                "pull request #{}: {} reviews",
                pull.number,
                marked.len()
            ));
        }
        for rt in &rts {
            let mine = marked
                .iter()
                .filter(|b| b.contains(&format!("{REVIEW_MARKER}{} -->", rt.id)))
                .count();
            if rt.state == "completed" && mine == 0 {
                f.lost.push(format!(
                    "review task {} is completed, but its review is not on pull request #{}",
                    rt.id, pull.number
                ));
            }
        }
        if marked.len() == 1 && !rts.iter().any(|rt| marked[0].contains(&rt.id)) {
            f.other.push(format!(
                "pull request #{}: its review names no review task of {}",
                pull.number, t.id
            ));
        }
    }
}

/// Each task's runs through the API, their costs summing to the task's; gives the runs by
/// (task, attempt).
fn runs_matching_task_costs(
    world: &World<'_>,
    snap: &Snapshot,
    f: &mut Findings,
) -> Result<BTreeMap<(String, i64), Vec<RunRow>>, String> {
    let mut runs: BTreeMap<(String, i64), Vec<RunRow>> = BTreeMap::new();
    for (i, t) in snap.tasks.iter().enumerate() {
        let path = format!("/api/tasks/{}", t.id);
        let a = world.api.call("GET", &path, None, i, On5xx::Retry)?;
        if a.status != 200 {
            return Err(format!("GET {path}: {} {}", a.status, a.body));
        }
        let mut sum: Option<Decimal> = None;
        let task_runs: Vec<RunRow> = serde_json::from_value(a.body["runs"].clone())
            .map_err(|e| format!("GET {path}: the runs: {e}"))?;
        for run in task_runs {
            if let Some(c) = run.cost {
                sum = Some(sum.unwrap_or_default() + c);
            }
            runs.entry((t.id.clone(), run.attempt))
                .or_default()
                .push(run);
        }
        if sum != t.cost {
            f.other.push(format!(
                "task {}: cost {:?}, but its runs sum to {:?}",
                t.id, t.cost, sum
            ));
        }
    }
    Ok(runs)
}

/// Costs: each recorded run once, at the cost the agent reported; gives (runs recorded,
/// those without a cost).
fn check_runs_against_ledger(
    runs: &BTreeMap<(String, i64), Vec<RunRow>>,
    ledger: &BTreeMap<(String, i64), Vec<Entry>>,
    f: &mut Findings,
) -> (usize, usize) {
    let mut recorded_runs = 0;
    let mut costless_runs = 0;
    for ((task, attempt), rs) in runs {
        recorded_runs += rs.len();
        costless_runs += rs.iter().filter(|r| r.cost.is_none()).count();
        if rs.len() > 1 {
            f.duplicates.push(format!(
                "task {task} attempt {attempt}: {} runs recorded",
                rs.len()
            ));
        }
        for r in rs {
            let Some(cost) = r.cost else { continue };
            match ledger.get(&(task.clone(), *attempt)).map(Vec::as_slice) {
                Some([e]) if e.cost == cost => {}
                Some([e]) => f.other.push(format!(
                    "task {task} attempt {attempt}: recorded ${cost} ({}), the agent reported ${}",
                    r.outcome, e.cost
                )),
                _ => f.other.push(format!(
                    "task {task} attempt {attempt}: recorded ${cost} ({}), but no single agent run reported it",
                    r.outcome
                )),
            }
        }
    }
    (recorded_runs, costless_runs)
}

/// Each agent run once, and its cost recorded unless the replica running it was killed before
/// the result reached it; gives (costs excused, agent runs).
fn check_ledger_against_runs(
    ledger: &BTreeMap<(String, i64), Vec<Entry>>,
    runs: &BTreeMap<(String, i64), Vec<RunRow>>,
    kills: &[Kill],
    f: &mut Findings,
) -> (usize, usize) {
    let mut excused = 0;
    let mut ledger_lines = 0;
    for ((task, attempt), entries) in ledger {
        ledger_lines += entries.len();
        if entries.len() > 1 {
            f.duplicates.push(format!(
                "task {task} attempt {attempt}: the agent ran {} times",
                entries.len()
            ));
        }
        let Some(e) = entries.first() else { continue };
        let recorded = runs
            .get(&(task.clone(), *attempt))
            .is_some_and(|rs| rs.iter().any(|r| r.cost == Some(e.cost)));
        if recorded {
            continue;
        }
        // Not recorded: excused only when the replica that ran it was killed after the
        // agent started and the agent's result was not in that replica's output log when
        // it died (read right after the kill).
        let killed = kills
            .iter()
            .find(|k| k.replica == e.replica && k.at_ms >= e.start_ms);
        match killed {
            Some(k) if !k.results_on_disk.contains(&(task.clone(), *attempt)) => {
                excused += 1;
                f.notes.push(format!(
                    "task {task} attempt {attempt}: ${} not recorded; replica {} was killed {} ms after the agent started, before the agent's result reached it",
                    e.cost,
                    e.replica,
                    k.at_ms.saturating_sub(e.start_ms)
                ));
            }
            Some(k) => f.lost.push(format!(
                "task {task} attempt {attempt}: ${} lost; the agent's result was in replica {}'s output log when it was killed {} ms after the agent ended",
                e.cost,
                e.replica,
                k.at_ms.saturating_sub(e.end_ms)
            )),
            None => f.lost.push(format!(
                "task {task} attempt {attempt}: the agent reported ${} on replica {}, which was not killed, and no run records it",
                e.cost, e.replica
            )),
        }
    }

    (excused, ledger_lines)
}

/// The cost report against a recomputation from the task list (2 days: a run may cross
/// midnight UTC); gives (the total cost, how many tasks have a cost).
fn check_cost_report(
    world: &World<'_>,
    snap: &Snapshot,
    f: &mut Findings,
) -> Result<(Decimal, usize), String> {
    let a = world
        .api
        .call("GET", "/api/analytics/costs?days=2", None, 0, On5xx::Retry)?;
    if a.status != 200 {
        return Err(format!("GET /api/analytics/costs: {} {}", a.status, a.body));
    }
    let report = &a.body;
    let costed: Vec<&TaskRow> = snap.tasks.iter().filter(|t| t.cost.is_some()).collect();
    let total: Decimal = costed.iter().filter_map(|t| t.cost).sum();
    let round4 = |d: Decimal| d.round_dp_with_strategy(4, RoundingStrategy::MidpointAwayFromZero);
    let mut expect = |what: &str, got: Result<Option<Decimal>, String>, want: Decimal| match got {
        Ok(Some(g)) if g == want => {}
        Ok(g) => f.other.push(format!(
            "cost report {what}: {g:?}, recomputed from the tasks: {want}"
        )),
        Err(e) => f.other.push(format!("cost report {what}: {e}")),
    };
    expect(
        "summary.totalCost",
        decimal(&report["summary"]["totalCost"]),
        round4(total),
    );
    expect(
        "summary.taskCount",
        decimal(&report["summary"]["taskCount"]),
        Decimal::from(snap.tasks.len()),
    );
    expect(
        "summary.tasksWithCost",
        decimal(&report["summary"]["tasksWithCost"]),
        Decimal::from(costed.len()),
    );
    let daily: Result<Decimal, String> = report["dailyCosts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| decimal(&d["cost"]).map(Option::unwrap_or_default))
        .sum();
    expect("sum of dailyCosts", daily.map(Some), total);
    for kind in ["coding", "review"] {
        let want: Decimal = costed
            .iter()
            .filter(|t| t.task_type == kind)
            .filter_map(|t| t.cost)
            .sum();
        let row = report["costByType"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["taskType"] == kind);
        let got = row.map_or(Ok(Some(Decimal::ZERO)), |r| decimal(&r["totalCost"]));
        expect(&format!("costByType {kind}"), got, want);
    }

    Ok((total, costed.len()))
}

#[cfg(test)]
mod tests {
    use super::close_deliveries;

    #[test]
    fn a_resent_close_is_one_close_and_a_blind_redelivery_is_two() {
        let count = |seq: &[(&'static str, u16)]| close_deliveries(seq.iter().copied());
        assert_eq!(count(&[]), 0);
        assert_eq!(count(&[("GET", 200), ("PATCH", 200)]), 1);
        // The answer was lost after the close; the client sent it again.
        assert_eq!(count(&[("GET", 200), ("PATCH", 502), ("PATCH", 200)]), 1);
        // Failed without effect, then a later delivery read the issue and closed it.
        assert_eq!(
            count(&[("PATCH", 500), ("PATCH", 503), ("GET", 200), ("PATCH", 200)]),
            1
        );
        // Closed (answer lost), and the next delivery read it and sent nothing.
        assert_eq!(count(&[("PATCH", 502), ("PATCH", 500), ("GET", 200)]), 1);
        // A later delivery closed it again.
        assert_eq!(count(&[("PATCH", 200), ("GET", 200), ("PATCH", 200)]), 2);
        assert_eq!(
            count(&[
                ("PATCH", 502),
                ("PATCH", 500),
                ("PATCH", 200),
                ("GET", 200),
                ("PATCH", 200)
            ]),
            2
        );
    }
}
