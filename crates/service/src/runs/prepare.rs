//! Preparing a run: what a claimed task's job needs (its repository, the code-host token,
//! the cost it may still spend) and the agent's instructions for each kind of task.

use super::*;

/// What a run needs besides the job.
pub(super) struct Prepared {
    pub(super) job: Job,
    pub(super) repo: Repository,
    /// A review task's coding task (with its pull request).
    pub(super) parent: Option<Task>,
    pub(super) token: secrets::SecretValue,
}

/// Why a claimed task's run does not start, and what is recorded for it.
#[derive(Debug)]
pub(super) enum Refusal {
    /// The task cannot run (no repository, no token, its cost limit spent, ...): it fails
    /// with this reason as its reason and error; no run is recorded.
    Fails(String),
    /// The database could not be read: nothing is recorded; the task's lease expires and
    /// recovery requeues it.
    Unreadable(ServiceError),
}

impl Refusal {
    /// The task fails with `reason`.
    fn fails(reason: impl Into<String>) -> Refusal {
        Refusal::Fails(reason.into())
    }

    /// Records what the refusal says for `task` (see the variants).
    pub(super) async fn record(self, service: &Service, task: &Task) {
        match self {
            Refusal::Fails(reason) => settle_without_run(service, task, &reason).await,
            Refusal::Unreadable(e) => {
                tracing::error!(task = %task.id, error = %e, "could not prepare a run");
            }
        }
    }
}

impl From<ServiceError> for Refusal {
    fn from(e: ServiceError) -> Self {
        Refusal::Unreadable(e)
    }
}

impl From<DbError> for Refusal {
    fn from(e: DbError) -> Self {
        Refusal::Unreadable(e.into())
    }
}

/// The agent's part of a job: its kind, the agent, its instructions, and a review task's
/// coding task.
type JobParts = (JobKind, AgentSpec, String, Option<Task>);

/// Reads what the job needs, in named steps: the repository and the token
/// ([`runnable_repository`]), the cost the run may spend ([`budget_of`]), and the agent's
/// part of the job ([`job_parts`]).
pub(super) fn prepare(
    conn: &mut AnyConnection,
    key: &secrets::MasterKey,
    task: &Task,
    settings: &RunSettings,
    allow_local: bool,
    holding: agentry_persistence::budgets::Holding,
) -> Result<Prepared, Refusal> {
    let (repo, token) = runnable_repository(conn, key, task)?;
    let budget = budget_of(conn, task, &repo, holding)?;
    let (kind, agent, prompt, parent) = job_parts(conn, task, &repo, budget)?;
    let job = Job {
        task_id: task.id,
        attempt: task.attempt,
        kind,
        repo: RepoSpec {
            key: repo.id.to_string(),
            clone_url: repo.clone_url.clone(),
            default_branch: repo.default_branch.clone(),
            host: repo.url.host().to_owned(),
            allow_local,
        },
        agent,
        prompt,
        auth: GitAuth::token(token.expose()),
        wall_time: settings.wall_time,
    };
    Ok(Prepared {
        job,
        repo,
        parent,
        token,
    })
}

/// Step 1: the task's repository, connected, and the stored code-host token.
fn runnable_repository(
    conn: &mut AnyConnection,
    key: &secrets::MasterKey,
    task: &Task,
) -> Result<(Repository, secrets::SecretValue), Refusal> {
    let Some(repo_id) = task.repo_id else {
        return Err(Refusal::fails("the task's repository is not connected"));
    };
    let repo = repos::get_repository(conn, repo_id)?;
    if repo.disconnected_at.is_some() {
        return Err(Refusal::Fails(format!(
            "the repository {} was disconnected",
            repo.url
        )));
    }
    let Some(token) = secrets::get(conn, key, TOKEN_SECRET).map_err(ServiceError::from)? else {
        return Err(Refusal::Fails(format!(
            "no code-host token is stored (PUT /api/secrets/{TOKEN_SECRET})"
        )));
    };
    Ok((repo, token))
}

/// Step 2: the most the run may spend: what is left of the task's cost limit and, for a
/// run holding its whole allowance, its reserve of the monthly budgets; refused when the
/// task's limit is spent.
fn budget_of(
    conn: &mut AnyConnection,
    task: &Task,
    repo: &Repository,
    holding: agentry_persistence::budgets::Holding,
) -> Result<Option<Usd>, Refusal> {
    let budget = match repo.settings.max_cost_per_task_usd {
        None => None,
        Some(cap) => {
            let spent = task.cost_usd.map_or(0, Usd::to_nanos);
            let left = cap.to_nanos().saturating_sub(spent);
            if left <= 0 {
                return Err(Refusal::Fails(format!(
                    "the task has spent its cost limit of {cap} USD (maxCostPerTaskUsd)"
                )));
            }
            Usd::from_nanos(left).ok()
        }
    };
    // A run holding its whole allowance took the monthly budgets' share when it was claimed:
    // it may spend the least of the two. A metered run holds the budgets call by call at the
    // gateway instead, so its own limit is the task's cap alone.
    let reserve = match holding {
        agentry_persistence::budgets::Holding::WholeRun => {
            agentry_persistence::budgets::reserve_of(conn, task.id)?
        }
        agentry_persistence::budgets::Holding::PerCall => None,
    };
    Ok(match (budget, reserve) {
        (Some(cap), Some(reserve)) => Some(cap.min(reserve)),
        (cap, reserve) => cap.or(reserve),
    })
}

/// Step 3: the agent's part of the job for the task's kind (coding, revision, review).
fn job_parts(
    conn: &mut AnyConnection,
    task: &Task,
    repo: &Repository,
    budget: Option<Usd>,
) -> Result<JobParts, Refusal> {
    let s = &repo.settings;
    Ok(match task.task_type {
        TaskType::Coding if task.revision().is_some() => {
            let Some(number) = task.pr_number else {
                return Err(Refusal::fails(
                    "a revision of a task without a pull request",
                ));
            };
            let feedback = crate::revisions::round_feedback(conn, task)?;
            (
                JobKind::Revision {
                    branch: branch_name(task.id),
                    commit_message: format!(
                        "Revise: {}\n\nagentry task {} (revision {})",
                        crate::closing_refs::neutralise(&task.title),
                        task.id,
                        task.revisions
                    ),
                },
                AgentSpec {
                    agent_type: task.agent_type,
                    model: s.model_for(task.agent_type, false).to_owned(),
                    max_turns: s.max_turns_coding,
                    max_budget_usd: budget,
                },
                revision_prompt(repo, task, number, &feedback),
                None,
            )
        }
        TaskType::Coding => (
            JobKind::Coding {
                // The title cannot close other issues (crate::closing_refs).
                commit_message: format!(
                    "{}\n\nagentry task {}",
                    crate::closing_refs::neutralise(&task.title),
                    task.id
                ),
            },
            AgentSpec {
                agent_type: task.agent_type,
                model: s.model_for(task.agent_type, false).to_owned(),
                max_turns: s.max_turns_coding,
                max_budget_usd: budget,
            },
            coding_prompt(task),
            None,
        ),
        TaskType::Review => {
            let Some(parent_id) = task.parent_task_id else {
                return Err(Refusal::fails("a review task without its coding task"));
            };
            let parent = tasks::get_task(conn, parent_id)?;
            let Some(number) = parent.pr_number else {
                return Err(Refusal::fails("the reviewed task has no pull request"));
            };
            (
                JobKind::Review {
                    branch: branch_name(parent.id),
                },
                AgentSpec {
                    agent_type: task.agent_type,
                    model: s.model_for(task.agent_type, true).to_owned(),
                    max_turns: Some(s.max_turns_review),
                    max_budget_usd: budget,
                },
                review_prompt(repo, &parent, number),
                Some(parent),
            )
        }
    })
}

/// The coding agent's instructions: the task's title, then its prompt (the issue body).
fn coding_prompt(task: &Task) -> String {
    if task.prompt.trim().is_empty() {
        task.title.clone()
    } else {
        format!("{}\n\n{}", task.title, task.prompt)
    }
}

/// A revision's instructions: the task, then every review and comment that asked for
/// changes in this round (the runner adds what the pull request changes so far).
fn revision_prompt(
    repo: &Repository,
    task: &Task,
    number: i64,
    feedback: &[agentry_persistence::revisions::Feedback],
) -> String {
    use agentry_persistence::revisions::FeedbackSource;
    let mut prompt = format!(
        "You opened pull request #{number} of {url} for the task below, and reviewers asked          for changes. Its branch is checked out here with the work so far; make the changes          they ask for on top of it (do not start over). Your changes are committed and pushed          to the same pull request.\n\n## The task\n\n{task}\n\n## What the reviewers asked for\n",
        url = repo.url,
        task = coding_prompt(task),
    );
    for f in feedback {
        let what = match (f.source, &f.path, f.line) {
            (FeedbackSource::Review, _, _) => "Review".to_owned(),
            (FeedbackSource::AgentReview, _, _) => "Automated review".to_owned(),
            (FeedbackSource::ReviewComment, Some(path), Some(line)) => {
                format!("Comment on `{path}` line {line}")
            }
            (FeedbackSource::ReviewComment, Some(path), None) => format!("Comment on `{path}`"),
            _ => "Comment".to_owned(),
        };
        prompt.push_str(&format!(
            "\n### {what} by @{author} ({url})\n\n{body}\n",
            author = f.author,
            url = f.url,
            body = f.body.trim(),
        ));
    }
    prompt
}

/// The review agent's instructions.
fn review_prompt(repo: &Repository, parent: &Task, number: i64) -> String {
    format!(
        "Review pull request #{number} of {url}: \"{title}\".\n\
         The pull request's branch is checked out here; see its changes with \
         `git diff origin/{base}...HEAD`.\n\n\
         The task it implements:\n{prompt}\n\n\
         Write a concise code review: correctness problems first, then risks and missing \
         tests. Do not change any file. Your final message is posted on the pull request as \
         the review.",
        url = repo.url,
        title = parent.title,
        base = repo.default_branch,
        prompt = coding_prompt(parent),
    )
}
