//! Webhook payloads built from the fake's state, for tests that deliver webhooks: the ids,
//! users, bodies and `html_url`s agree with what the fake's REST endpoints serve, and the
//! shapes are GitHub's (`action`, the subject, `repository`, `sender`), so that a webhook
//! parser written against GitHub's documented payloads reads them.
//!
//! Sign and send them yourself (`X-GitHub-Event` is the function's event name). Every
//! function panics, naming what is missing, when the pull request or the subject does not
//! exist: they are test helpers, called after the test created it.

use serde_json::{Map, Value, json};

use super::model::{Item, Pull, Repo, State, repo_key};
use super::{FakeGitHub, no_pull};

/// The `repository` of a webhook payload: the repository without the members only the
/// REST API adds for the token's user.
fn repository(state: &State, repo: &Repo) -> Value {
    let mut value = state.repo_json(repo);
    if let Value::Object(map) = &mut value {
        for member in ["permissions", "network_count", "subscribers_count"] {
            map.remove(member);
        }
    }
    value
}

/// A payload: `action`, the `subject`'s members, `repository` and `sender` (the user with
/// this login).
fn payload(
    state: &State,
    repo: &Repo,
    action: &str,
    subject: [(&str, Value); 2],
    sender: &str,
) -> Value {
    let mut map = Map::new();
    map.insert("action".to_owned(), json!(action));
    for (member, value) in subject {
        map.insert(member.to_owned(), value);
    }
    map.insert("repository".to_owned(), repository(state, repo));
    map.insert("sender".to_owned(), state.user_json(sender));
    Value::Object(map)
}

/// `X-GitHub-Event: pull_request_review`, action `submitted`, for review `review_id` of pull
/// request `number`: `review` (its `state` in lower case, as webhooks send it, e.g.
/// `changes_requested`), `pull_request` (the list shape, as in GitHub's payloads),
/// `repository` and `sender` (the reviewer).
///
/// # Panics
/// If the pull request or the review does not exist.
#[track_caller]
pub fn pull_request_review_submitted(
    fake: &FakeGitHub,
    owner: &str,
    name: &str,
    number: u64,
    review_id: u64,
) -> Value {
    let state = fake.state();
    let (at, pull) = pull_in(&state, owner, name, number);
    let review = at.by_id(&pull.reviews, review_id, |r| r.id, "review");
    let mut review_json = state.review_json(at.repo, at.item, review);
    if let Value::Object(map) = &mut review_json {
        map.insert("state".to_owned(), json!(review.state.to_ascii_lowercase()));
    }
    let pull_json = state.pull_json(at.repo, at.item, pull, false);
    payload(
        &state,
        at.repo,
        "submitted",
        [("review", review_json), ("pull_request", pull_json)],
        &review.user,
    )
}

/// `X-GitHub-Event: pull_request`, action `closed`, for pull request `number` after it was
/// merged ([`FakeGitHub::merge_pull`]) or closed ([`FakeGitHub::close_pull`]): `number`,
/// `pull_request` (the single-pull shape, with `merged`), `repository` and `sender` (who
/// merged or closed it).
///
/// # Panics
/// If the pull request does not exist or is open.
#[track_caller]
pub fn pull_request_closed(fake: &FakeGitHub, owner: &str, name: &str, number: u64) -> Value {
    let state = fake.state();
    let (at, pull) = pull_in(&state, owner, name, number);
    assert!(
        !at.item.open,
        "fake GitHub: pull request {owner}/{name}#{number} is open (merge or close it first)"
    );
    let sender = pull
        .merged_by
        .clone()
        .or_else(|| at.item.closed_by.clone())
        .unwrap_or_else(|| at.repo.owner.clone());
    let subject = [
        ("number", json!(number)),
        (
            "pull_request",
            state.pull_json(at.repo, at.item, pull, true),
        ),
    ];
    payload(&state, at.repo, "closed", subject, &sender)
}

/// `X-GitHub-Event: issue_comment`, action `created`, for comment `comment_id` of issue or
/// pull request `number`: `issue` (with its `pull_request` member when it is one),
/// `comment`, `repository` and `sender` (the author).
///
/// # Panics
/// If the issue or the comment does not exist.
#[track_caller]
pub fn issue_comment_created(
    fake: &FakeGitHub,
    owner: &str,
    name: &str,
    number: u64,
    comment_id: u64,
) -> Value {
    let state = fake.state();
    let at = item_in(&state, owner, name, number);
    let comment = at.by_id(&at.item.comments, comment_id, |c| c.id, "comment");
    let subject = [
        ("issue", state.issue_json(at.repo, at.item, false)),
        ("comment", state.comment_json(at.repo, at.item, comment)),
    ];
    payload(&state, at.repo, "created", subject, &comment.user)
}

/// `X-GitHub-Event: pull_request_review_comment`, action `created`, for review comment
/// `comment_id` of pull request `number`: `comment`, `pull_request` (the list shape),
/// `repository` and `sender` (the author).
///
/// # Panics
/// If the pull request or the review comment does not exist.
#[track_caller]
pub fn pull_request_review_comment_created(
    fake: &FakeGitHub,
    owner: &str,
    name: &str,
    number: u64,
    comment_id: u64,
) -> Value {
    let state = fake.state();
    let (at, pull) = pull_in(&state, owner, name, number);
    let comment = at.by_id(
        &pull.review_comments,
        comment_id,
        |c| c.id,
        "review comment",
    );
    let subject = [
        (
            "comment",
            state.review_comment_json(at.repo, at.item, comment),
        ),
        (
            "pull_request",
            state.pull_json(at.repo, at.item, pull, false),
        ),
    ];
    payload(&state, at.repo, "created", subject, &comment.user)
}

/// Issue or pull request `number` of a repository, as the fake holds it.
struct Subject<'s> {
    repo: &'s Repo,
    item: &'s Item,
    /// `owner/name#number`, for the panic of [`Subject::by_id`].
    on: String,
}

impl<'s> Subject<'s> {
    /// The one of `items` (issue or pull request's comments, reviews, review comments)
    /// whose id (as `id_of` reads it) is `id`.
    ///
    /// # Panics
    /// If there is none: "no `what` `id` on `owner/name#number`".
    #[track_caller]
    fn by_id<T>(&self, items: &'s [T], id: u64, id_of: impl Fn(&T) -> u64, what: &str) -> &'s T {
        items
            .iter()
            .find(|x| id_of(x) == id)
            .unwrap_or_else(|| panic!("fake GitHub: no {what} {id} on {}", self.on))
    }
}

/// Issue or pull request `number` of `owner/name`.
///
/// # Panics
/// If there is none.
#[track_caller]
fn item_in<'s>(state: &'s State, owner: &str, name: &str, number: u64) -> Subject<'s> {
    let found = state
        .repos
        .get(&repo_key(owner, name))
        .and_then(|repo| Some((repo, repo.items.get(&number)?)));
    let Some((repo, item)) = found else {
        panic!("fake GitHub: no issue {owner}/{name}#{number}")
    };
    Subject {
        repo,
        item,
        on: format!("{owner}/{name}#{number}"),
    }
}

/// Pull request `number` of `owner/name`, and its pull-request side.
///
/// # Panics
/// If there is none.
#[track_caller]
fn pull_in<'s>(state: &'s State, owner: &str, name: &str, number: u64) -> (Subject<'s>, &'s Pull) {
    let pull = state
        .repos
        .get(&repo_key(owner, name))
        .and_then(|repo| repo.items.get(&number)?.pull.as_ref());
    let Some(pull) = pull else {
        no_pull(owner, name, number)
    };
    (item_in(state, owner, name, number), pull)
}
