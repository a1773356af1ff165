//! Publishing a run's result on the code host exactly once: the pull request opened (or
//! found opened by an earlier try) and the review posted (or found by its marker), with
//! a doubling wait through failures whose outcome is unknown.

use agentry_domain::backoff::Backoff;

use super::*;

/// How publishing ended.
pub(super) enum Published {
    /// Done (or found done by an earlier try): the pull request it concerns.
    Done(PullRequestRef),
    /// A definite refusal, or failures past the patience: why, for the task's error.
    Refused(String),
    /// The task is no longer this runner's to settle (cancelled, recovered elsewhere) or the
    /// process is shutting down: nothing more is done; the run is recorded.
    Stopped,
}

/// Whether a failed call may have taken effect, or may succeed later: the outcome of a
/// write is unknown after a 5xx, a timeout or an unreadable answer, and a rate limit only
/// delays. Anything else (401, 403, 404, 422, …) is a definite answer.
fn uncertain(e: &CodeHostError) -> bool {
    e.is_transient() || matches!(e, CodeHostError::InvalidResponse(_))
}

/// The longest wait between publishing tries.
const MAX_PUBLISH_BACKOFF: Duration = Duration::from_secs(30);

/// The waits between publishing tries: a doubling backoff, bounded by the patience, cut
/// short when the run is stopped.
pub(super) struct Patience {
    started: tokio::time::Instant,
    backoff: Backoff,
    limit: Duration,
    cancel: watch::Receiver<bool>,
    tries: u32,
}

impl Patience {
    pub(super) fn new(settings: &RunSettings, cancel: watch::Receiver<bool>) -> Self {
        Patience {
            started: tokio::time::Instant::now(),
            backoff: Backoff {
                base: settings.publish_backoff,
                max: MAX_PUBLISH_BACKOFF,
            },
            limit: settings.publish_patience,
            cancel,
            tries: 1,
        }
    }

    fn stopped(&self, service: &Service) -> bool {
        service.parts.runs.stopping.load(Ordering::SeqCst) || *self.cancel.borrow()
    }

    /// After an uncertain failure `why`: waits for the next try (`None`), or says how
    /// publishing ends instead.
    pub(super) async fn wait(
        &mut self,
        service: &Service,
        task: &Task,
        why: &str,
    ) -> Option<Published> {
        if self.stopped(service) {
            return Some(Published::Stopped);
        }
        let elapsed = self.started.elapsed();
        let delay = self
            .backoff
            .delay(i32::try_from(self.tries - 1).unwrap_or(i32::MAX));
        if elapsed + delay > self.limit {
            return Some(Published::Refused(format!(
                "{why} (still failing after {} tries in {} s)",
                self.tries,
                elapsed.as_secs()
            )));
        }
        tracing::warn!(
            task = %task.id, attempt = task.attempt, tries = self.tries,
            retry_in_ms = delay.as_millis() as u64, error = why,
            "publishing failed with an unknown outcome; trying again"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = self.cancel.changed() => {}
        }
        if self.stopped(service) {
            return Some(Published::Stopped);
        }
        self.tries += 1;
        None
    }
}

/// A run's cost as the pull request or review says it.
fn cost_text(cost: Option<Usd>) -> String {
    cost.map_or_else(|| "not reported".to_owned(), |c| format!("${c}"))
}

/// Opens the pull request of a pushed branch, or finds the one an earlier try opened.
///
/// After a failure whose outcome is unknown, or a 422 (GitHub's answer when the branch
/// already has one), the branch's open pull request is looked up before anything is sent
/// again, so none is ever opened twice; only a definite refusal ends it.
pub(super) async fn open_pull_request(
    service: &Service,
    prepared: &Prepared,
    task: &Task,
    branch: &str,
    cost: Option<Usd>,
    patience: &mut Patience,
) -> Published {
    const FAILED: &str = "the pull request could not be opened";
    let github = match service.parts.codehost.client(&prepared.token) {
        Ok(github) => github,
        Err(e) => return Published::Refused(format!("no code-host client: {e}")),
    };
    let repo = &prepared.repo;
    let (owner, name) = (repo.url.owner(), repo.url.name());
    // The title cannot close other issues (crate::closing_refs); the body closes the task's
    // own issue only.
    let title = crate::closing_refs::neutralise(&task.title);
    let mut body = String::new();
    if let Some(n) = task.issue_number {
        body.push_str(&format!("Closes #{n}\n\n"));
    }
    body.push_str(&format!(
        "Opened by agentry for task `{}` (attempt {}). Run cost: {}.",
        task.id,
        task.attempt,
        cost_text(cost)
    ));
    loop {
        // Cancelled (or the service stopping) since the run was recorded: nothing is opened.
        if patience.stopped(service) {
            return Published::Stopped;
        }
        let created = github
            .create_pull(owner, name, &title, branch, &repo.default_branch, &body)
            .await;
        let failure = match created {
            Ok(pull) => return pull_request_ref(pull.number, pull.html_url),
            Err(e) if uncertain(&e) || e.status() == Some(422) => e,
            Err(e) => return Published::Refused(format!("{FAILED}: {e}")),
        };
        // Already there (an earlier creation whose answer was lost, or a retry)?
        let why = match github.open_pull_for_branch(owner, name, branch).await {
            Ok(Some(pull)) => return pull_request_ref(pull.number, pull.html_url),
            Ok(None) if !uncertain(&failure) => {
                return Published::Refused(format!("{FAILED}: {failure}"));
            }
            Ok(None) => format!("{FAILED}: {failure}"),
            Err(e) if uncertain(&e) => format!("{FAILED}: {failure}; then looking it up: {e}"),
            Err(e) => return Published::Refused(format!("{FAILED}: {failure}; {e}")),
        };
        if let Some(end) = patience.wait(service, task, &why).await {
            return end;
        }
    }
}

/// The pull request the code host answered, or a refusal when its number is impossible.
fn pull_request_ref(number: u64, url: String) -> Published {
    match i64::try_from(number) {
        Ok(number) => Published::Done(PullRequestRef { url, number }),
        Err(_) => Published::Refused(
            "the code host answered an impossible pull request number".to_owned(),
        ),
    }
}

/// The marker a posted review ends with.
fn review_marker(task_id: Uuid) -> String {
    format!("<!-- agentry:review:{task_id} -->")
}

/// Posts the review text on the coding task's pull request unless its marker is already
/// there. Before every try the pull request's reviews are searched for the marker, so a
/// post whose answer was lost is never repeated; only a definite refusal ends it.
pub(super) async fn post_review(
    service: &Service,
    prepared: &Prepared,
    task: &Task,
    text: &str,
    cost: Option<Usd>,
    patience: &mut Patience,
) -> Published {
    const FAILED: &str = "the review could not be posted";
    let Some(parent) = prepared.parent.as_ref() else {
        return Published::Refused("a review task without its coding task".to_owned());
    };
    let (Some(number), Some(url)) = (parent.pr_number, parent.pr_url.clone()) else {
        return Published::Refused("the reviewed task has no pull request".into());
    };
    let github = match service.parts.codehost.client(&prepared.token) {
        Ok(github) => github,
        Err(e) => return Published::Refused(format!("no code-host client: {e}")),
    };
    let repo = &prepared.repo;
    let (owner, name) = (repo.url.owner(), repo.url.name());
    let Ok(unsigned) = u64::try_from(number) else {
        return Published::Refused("invalid pull request number".to_owned());
    };
    let marker = review_marker(task.id);
    // The agent's words ping nobody and forge no marker (crate::posted_text).
    let body = format!(
        "{}\n\n---\nReview by agentry (task `{}`, cost {}).\n{marker}",
        crate::posted_text::quiet(text),
        task.id,
        cost_text(cost)
    );
    loop {
        if patience.stopped(service) {
            return Published::Stopped;
        }
        // Only a review of agentry's own account counts as posted: anyone may write the
        // marker in a review of theirs.
        let posted = match github.own_login().await {
            Ok(own) => github.reviews(owner, name, unsigned).await.map(|reviews| {
                reviews
                    .iter()
                    .any(|r| r.author.eq_ignore_ascii_case(&own) && r.body.contains(&marker))
            }),
            Err(e) => Err(e),
        };
        let failure = match posted {
            Ok(true) => {
                return Published::Done(PullRequestRef { url, number });
            }
            Ok(false) => match github.create_review(owner, name, unsigned, &body).await {
                Ok(_) => return Published::Done(PullRequestRef { url, number }),
                Err(e) => e,
            },
            Err(e) => e,
        };
        if !uncertain(&failure) {
            return Published::Refused(format!("{FAILED}: {failure}"));
        }
        let why = format!("{FAILED}: {failure}");
        if let Some(end) = patience.wait(service, task, &why).await {
            return end;
        }
    }
}
