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

/// Reads what the job needs; `Err` is why the task cannot run at all.
pub(super) fn prepare(
    conn: &mut AnyConnection,
    key: &secrets::MasterKey,
    task: &Task,
    settings: &RunSettings,
    allow_local: bool,
    holding: agentry_persistence::budgets::Holding,
) -> Result<Result<Prepared, String>, ServiceError> {
    let Some(repo_id) = task.repo_id else {
        return Ok(Err("the task's repository is not connected".into()));
    };
    let repo = repos::get_repository(conn, repo_id)?;
    if repo.disconnected_at.is_some() {
        return Ok(Err(format!("the repository {} was disconnected", repo.url)));
    }
    let Some(token) = secrets::get(conn, key, TOKEN_SECRET).map_err(ServiceError::from)? else {
        return Ok(Err(format!(
            "no code-host token is stored (PUT /api/secrets/{TOKEN_SECRET})"
        )));
    };
    let s = &repo.settings;
    let budget = match s.max_cost_per_task_usd {
        None => None,
        Some(cap) => {
            let spent = task.cost_usd.map_or(0, Usd::to_nanos);
            let left = cap.to_nanos().saturating_sub(spent);
            if left <= 0 {
                return Ok(Err(format!(
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
    let budget = match (budget, reserve) {
        (Some(cap), Some(reserve)) => Some(cap.min(reserve)),
        (cap, reserve) => cap.or(reserve),
    };
    let (kind, agent, prompt, parent) = match task.task_type {
        TaskType::Coding if task.revision().is_some() => {
            let Some(number) = task.pr_number else {
                return Ok(Err("a revision of a task without a pull request".into()));
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
                revision_prompt(&repo, task, number, &feedback),
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
                return Ok(Err("a review task without its coding task".into()));
            };
            let parent = tasks::get_task(conn, parent_id)?;
            let Some(number) = parent.pr_number else {
                return Ok(Err("the reviewed task has no pull request".into()));
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
                review_prompt(&repo, &parent, number),
                Some(parent),
            )
        }
    };
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
    Ok(Ok(Prepared {
        job,
        repo,
        parent,
        token,
    }))
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
