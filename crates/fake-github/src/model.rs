//! The fake GitHub's state and how it is written as GitHub REST v3 JSON.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value, json};
use time::OffsetDateTime;

use agentry_testkit::SplitMix64;

use super::util::{format_time, node_id, percent_encode, sha256_hex};
use super::{Fault, RequestRecord};

/// Where `html_url`s point, like github.com's own.
pub(crate) const HTML_BASE: &str = "https://github.com";
/// The colour GitHub gives labels created implicitly (by adding them to an issue).
pub(crate) const DEFAULT_LABEL_COLOR: &str = "ededed";
/// The primary rate limit of an authenticated user.
pub(crate) const RATE_LIMIT: u64 = 5000;
/// Length of a rate-limit window.
pub(crate) const RATE_WINDOW_SECS: i64 = 3600;

/// A user (token owner, repository owner, author).
#[derive(Debug, Clone)]
pub(crate) struct User {
    pub id: u64,
    pub created_at: i64,
}

/// A token the fake accepts.
#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub login: String,
    /// Lower-case `owner/name`s this token can see; `None` = every repository.
    pub repos: Option<Vec<String>>,
}

/// A repository label.
#[derive(Debug, Clone)]
pub(crate) struct Label {
    pub id: u64,
    pub name: String,
    pub color: String,
    pub description: Option<String>,
}

/// A comment on an issue or pull request.
#[derive(Debug, Clone)]
pub(crate) struct Comment {
    pub id: u64,
    pub body: String,
    pub user: String,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A pull-request review.
#[derive(Debug, Clone)]
pub(crate) struct Review {
    pub id: u64,
    pub body: String,
    pub state: String,
    pub user: String,
    pub submitted_at: i64,
    pub commit_id: String,
}

/// A review comment: a comment on a line of a pull request's diff.
#[derive(Debug, Clone)]
pub(crate) struct ReviewComment {
    pub id: u64,
    pub body: String,
    pub user: String,
    pub path: String,
    pub line: u64,
    pub created_at: i64,
    pub updated_at: i64,
    /// The review it belongs to (GitHub wraps a single comment in a `COMMENTED` review).
    pub review_id: u64,
    pub commit_id: String,
}

/// A reaction to an issue comment or a review comment.
#[derive(Debug, Clone)]
pub(crate) struct Reaction {
    pub id: u64,
    pub comment_id: u64,
    /// On a review comment (`true`) or an issue comment.
    pub review_comment: bool,
    pub content: String,
    pub user: String,
    pub created_at: i64,
}

/// The reaction contents GitHub accepts.
pub(crate) const REACTION_CONTENTS: [&str; 8] = [
    "+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes",
];

/// The roles [`super::FakeGitHub::set_permission`] accepts, strongest first.
pub(crate) const ROLES: [&str; 6] = ["admin", "maintain", "write", "triage", "read", "none"];

/// What a pull request has on top of its issue.
#[derive(Debug, Clone)]
pub(crate) struct Pull {
    pub id: u64,
    pub head_label: String,
    pub head_ref: String,
    pub head_sha: String,
    pub base_ref: String,
    pub base_sha: String,
    pub merged_at: Option<i64>,
    pub merged_by: Option<String>,
    pub merge_commit_sha: Option<String>,
    pub draft: bool,
    pub reviews: Vec<Review>,
    pub review_comments: Vec<ReviewComment>,
}

/// An issue, or the issue side of a pull request (numbers are shared, like GitHub's).
#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub id: u64,
    pub number: u64,
    pub title: String,
    pub body: Option<String>,
    pub user: String,
    pub open: bool,
    pub state_reason: Option<String>,
    /// Label names, as the repository spells them.
    pub labels: Vec<String>,
    pub comments: Vec<Comment>,
    pub created_at: i64,
    pub updated_at: i64,
    /// Global order of the last update: breaks ties between equal `updated_at` seconds.
    pub updated_seq: u64,
    pub closed_at: Option<i64>,
    pub closed_by: Option<String>,
    pub pull: Option<Pull>,
}

/// A repository.
#[derive(Debug, Clone)]
pub(crate) struct Repo {
    pub id: u64,
    pub owner: String,
    pub name: String,
    pub default_branch: String,
    pub clone_url: Option<String>,
    pub created_at: i64,
    pub labels: Vec<Label>,
    pub items: BTreeMap<u64, Item>,
    pub next_number: u64,
    /// Reactions to the repository's comments, oldest first.
    pub reactions: Vec<Reaction>,
    /// Roles set by [`super::FakeGitHub::set_permission`], keyed by lower-case login.
    pub permissions: BTreeMap<String, String>,
}

impl Repo {
    /// `owner/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.owner, self.name)
    }

    /// The issue (or pull request) and its comment `id`, if the repository has it.
    pub fn issue_comment(&self, id: u64) -> Option<(&Item, &Comment)> {
        self.items
            .values()
            .find_map(|i| i.comments.iter().find(|c| c.id == id).map(|c| (i, c)))
    }

    /// The pull request and the review comment `id`, if the repository has it.
    pub fn review_comment(&self, id: u64) -> Option<(&Item, &ReviewComment)> {
        self.items.values().find_map(|i| {
            i.pull
                .as_ref()?
                .review_comments
                .iter()
                .find(|c| c.id == id)
                .map(|c| (i, c))
        })
    }

    /// The role `login` has: the one set, `admin` for the owner, else `None`.
    pub fn role_of(&self, login: &str) -> Option<&str> {
        match self.permissions.get(&login.to_ascii_lowercase()) {
            Some(role) => Some(role.as_str()),
            None if self.owner.eq_ignore_ascii_case(login) => Some("admin"),
            None => None,
        }
    }

    /// The repository label of that name (case-insensitive, like GitHub).
    pub fn label(&self, name: &str) -> Option<&Label> {
        self.labels
            .iter()
            .find(|l| l.name.eq_ignore_ascii_case(name))
    }
}

/// How a fault rule picks requests.
#[derive(Debug, Clone)]
pub(crate) enum FaultMode {
    /// The next `n` matching requests.
    Next(usize),
    /// Each matching request with this probability.
    Fraction { probability: f64, rng: SplitMix64 },
}

/// A fault-injection rule.
#[derive(Debug, Clone)]
pub(crate) struct FaultRule {
    pub route: Option<(String, String)>,
    pub mode: FaultMode,
    pub fault: Fault,
}

/// The primary rate limit (one bucket for the whole fake).
#[derive(Debug, Clone)]
pub(crate) struct Rate {
    pub remaining: u64,
    pub reset_at: i64,
}

/// Everything the fake knows.
#[derive(Debug)]
pub(crate) struct State {
    pub base_url: String,
    next_id: u64,
    seq: u64,
    pub clock_offset_secs: i64,
    /// The real second the clock stopped at ([`super::FakeGitHub::freeze_clock`]).
    pub frozen_at: Option<i64>,
    /// Order issues updated in the same second by number instead of by update order.
    pub same_second_by_number: bool,
    /// Keyed by lower-case login.
    pub users: BTreeMap<String, User>,
    pub tokens: HashMap<String, Token>,
    /// Keyed by lower-case `owner/name`.
    pub repos: BTreeMap<String, Repo>,
    pub requests: Vec<RequestRecord>,
    pub faults: Vec<FaultRule>,
    pub rate: Rate,
}

/// The map key of a repository.
pub(crate) fn repo_key(owner: &str, name: &str) -> String {
    format!("{owner}/{name}").to_ascii_lowercase()
}

/// A fake 40-hex commit sha, stable for a given seed.
pub(crate) fn fake_sha(seed: &str) -> String {
    sha256_hex(seed.as_bytes()).chars().take(40).collect()
}

/// The URLs of an issue or pull request (see [`State::item_urls`]).
struct ItemUrls {
    /// `{base_url}/repos/{owner}/{name}/issues/{number}`.
    issue_api: String,
    /// `{base_url}/repos/{owner}/{name}/pulls/{number}`.
    pull_api: String,
    /// `https://github.com/{owner}/{name}/pull/{number}` for a pull request,
    /// `…/issues/{number}` for an issue.
    html: String,
}

impl State {
    pub fn new(base_url: String) -> Self {
        let now = OffsetDateTime::now_utc().unix_timestamp();
        Self {
            base_url,
            next_id: 1000,
            seq: 0,
            clock_offset_secs: 0,
            frozen_at: None,
            same_second_by_number: false,
            users: BTreeMap::new(),
            tokens: HashMap::new(),
            repos: BTreeMap::new(),
            requests: Vec::new(),
            faults: Vec::new(),
            rate: Rate {
                remaining: RATE_LIMIT,
                reset_at: now + RATE_WINDOW_SECS,
            },
        }
    }

    /// The fake's clock, in unix seconds (real time, or the second it was frozen at, plus
    /// `advance_clock`).
    pub fn now(&self) -> i64 {
        self.frozen_at
            .unwrap_or_else(|| OffsetDateTime::now_utc().unix_timestamp())
            .saturating_add(self.clock_offset_secs)
    }

    /// A fresh id for any object.
    pub fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Issue or pull request `number` of the repository `key`, to change it.
    pub fn item_mut(&mut self, key: &str, number: u64) -> Option<&mut Item> {
        self.repos
            .get_mut(key)
            .and_then(|r| r.items.get_mut(&number))
    }

    /// The next update sequence number.
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Starts a new rate-limit window when the current one is over.
    pub fn refresh_rate(&mut self) {
        let now = OffsetDateTime::now_utc().unix_timestamp();
        if now >= self.rate.reset_at {
            self.rate.remaining = RATE_LIMIT;
            self.rate.reset_at = now + RATE_WINDOW_SECS;
        }
    }

    /// The user of that login, created on first use.
    pub fn ensure_user(&mut self, login: &str) -> u64 {
        let key = login.to_ascii_lowercase();
        if let Some(user) = self.users.get(&key) {
            return user.id;
        }
        let id = self.new_id();
        let created_at = self.now();
        self.users.insert(key, User { id, created_at });
        id
    }

    /// Marks an item as updated now.
    pub fn touch(&mut self, key: &str, number: u64) {
        let now = self.now();
        let seq = self.next_seq();
        if let Some(item) = self.item_mut(key, number) {
            item.updated_at = now;
            item.updated_seq = seq;
        }
    }

    /// Adds a label to the repository if missing; returns its canonical name.
    pub fn ensure_label(&mut self, key: &str, name: &str, color: &str) -> Option<String> {
        let id = self.new_id();
        let repo = self.repos.get_mut(key)?;
        if let Some(existing) = repo.label(name) {
            return Some(existing.name.clone());
        }
        repo.labels.push(Label {
            id,
            name: name.to_owned(),
            color: color.to_owned(),
            description: None,
        });
        Some(name.to_owned())
    }

    /// Adds labels to an item (creating missing repository labels); true if anything changed.
    pub fn add_item_labels(&mut self, key: &str, number: u64, names: &[String]) -> bool {
        let mut changed = false;
        for name in names {
            let Some(canonical) = self.ensure_label(key, name, DEFAULT_LABEL_COLOR) else {
                return changed;
            };
            if let Some(item) = self.item_mut(key, number)
                && !item
                    .labels
                    .iter()
                    .any(|l| l.eq_ignore_ascii_case(&canonical))
            {
                item.labels.push(canonical);
                changed = true;
            }
        }
        if changed {
            self.touch(key, number);
        }
        changed
    }

    /// Creates an issue or pull request (without its labels); returns its number. `pull` is
    /// `(head_label, head_ref, base_ref, draft)`.
    pub fn create_item(
        &mut self,
        key: &str,
        title: &str,
        body: Option<&str>,
        user: &str,
        pull: Option<(String, String, String, bool)>,
    ) -> Option<u64> {
        self.ensure_user(user);
        let id = self.new_id();
        let pull_id = self.new_id();
        let now = self.now();
        let seq = self.next_seq();
        let repo = self.repos.get_mut(key)?;
        let number = repo.next_number;
        repo.next_number += 1;
        let pull = pull.map(|(head_label, head_ref, base_ref, draft)| Pull {
            id: pull_id,
            head_sha: fake_sha(&format!("{}#{number}:{head_ref}", repo.full_name())),
            base_sha: fake_sha(&format!("{}:{base_ref}", repo.full_name())),
            head_label,
            head_ref,
            base_ref,
            merged_at: None,
            merged_by: None,
            merge_commit_sha: None,
            draft,
            reviews: Vec::new(),
            review_comments: Vec::new(),
        });
        repo.items.insert(
            number,
            Item {
                id,
                number,
                title: title.to_owned(),
                body: body.map(str::to_owned),
                user: user.to_owned(),
                open: true,
                state_reason: None,
                labels: Vec::new(),
                comments: Vec::new(),
                created_at: now,
                updated_at: now,
                updated_seq: seq,
                closed_at: None,
                closed_by: None,
                pull,
            },
        );
        Some(number)
    }

    /// Submits a review of pull request `number` as `login` on its head commit; returns its
    /// id, or `None` when there is no such pull request. A submitted (not pending) review
    /// touches the pull request.
    pub fn push_review(
        &mut self,
        key: &str,
        number: u64,
        login: &str,
        state: &str,
        body: &str,
    ) -> Option<u64> {
        self.ensure_user(login);
        let id = self.new_id();
        let now = self.now();
        let pull = self.item_mut(key, number).and_then(|i| i.pull.as_mut())?;
        let commit_id = pull.head_sha.clone();
        pull.reviews.push(Review {
            id,
            body: body.to_owned(),
            state: state.to_owned(),
            user: login.to_owned(),
            submitted_at: now,
            commit_id,
        });
        if state != "PENDING" {
            self.touch(key, number);
        }
        Some(id)
    }

    /// Closes or reopens an item; true if its state changed.
    pub fn set_item_open(
        &mut self,
        key: &str,
        number: u64,
        open: bool,
        reason: Option<String>,
        actor: &str,
    ) -> bool {
        let now = self.now();
        let Some(item) = self.item_mut(key, number) else {
            return false;
        };
        if item.open == open {
            if let Some(reason) = reason
                && !open
            {
                item.state_reason = Some(reason);
            }
            return false;
        }
        item.open = open;
        if open {
            item.closed_at = None;
            item.closed_by = None;
            item.state_reason = Some("reopened".to_owned());
        } else {
            item.closed_at = Some(now);
            item.closed_by = Some(actor.to_owned());
            item.state_reason = Some(reason.unwrap_or_else(|| "completed".to_owned()));
        }
        self.touch(key, number);
        true
    }

    /// Merges an open pull request and returns the merge commit sha; `None` if it is not an
    /// open pull request.
    pub fn merge(&mut self, key: &str, number: u64, actor: &str) -> Option<String> {
        let now = self.now();
        let item = self.item_mut(key, number)?;
        if !item.open {
            return None;
        }
        let pull = item.pull.as_mut()?;
        let sha = fake_sha(&format!("merge:{}:{}", pull.id, pull.head_sha));
        pull.merged_at = Some(now);
        pull.merged_by = Some(actor.to_owned());
        pull.merge_commit_sha = Some(sha.clone());
        item.open = false;
        item.closed_at = Some(now);
        item.closed_by = Some(actor.to_owned());
        item.state_reason = None;
        self.touch(key, number);
        Some(sha)
    }

    // ----- JSON -----

    /// A user object as GitHub embeds it (`simple-user`).
    pub fn user_json(&self, login: &str) -> Value {
        let id = self
            .users
            .get(&login.to_ascii_lowercase())
            .map_or(0, |u| u.id);
        let api = format!("{}/users/{login}", self.base_url);
        json!({
            "login": login,
            "id": id,
            "node_id": node_id("User", id),
            "avatar_url": format!("https://avatars.githubusercontent.com/u/{id}?v=4"),
            "gravatar_id": "",
            "url": api,
            "html_url": format!("{HTML_BASE}/{login}"),
            "followers_url": format!("{api}/followers"),
            "following_url": format!("{api}/following{{/other_user}}"),
            "gists_url": format!("{api}/gists{{/gist_id}}"),
            "starred_url": format!("{api}/starred{{/owner}}{{/repo}}"),
            "subscriptions_url": format!("{api}/subscriptions"),
            "organizations_url": format!("{api}/orgs"),
            "repos_url": format!("{api}/repos"),
            "events_url": format!("{api}/events{{/privacy}}"),
            "received_events_url": format!("{api}/received_events"),
            "type": "User",
            "user_view_type": "public",
            "site_admin": false
        })
    }

    /// The authenticated user (`GET /user`, `private-user`).
    pub fn private_user_json(&self, login: &str) -> Value {
        let mut value = self.user_json(login);
        let user = self.users.get(&login.to_ascii_lowercase());
        let created = user.map_or(0, |u| u.created_at);
        let public_repos = self
            .repos
            .values()
            .filter(|r| r.owner.eq_ignore_ascii_case(login))
            .count();
        if let Value::Object(map) = &mut value {
            let extra = json!({
                "name": login,
                "company": null,
                "blog": "",
                "location": null,
                "email": null,
                "hireable": null,
                "bio": null,
                "twitter_username": null,
                "notification_email": null,
                "public_repos": public_repos,
                "public_gists": 0,
                "followers": 0,
                "following": 0,
                "created_at": format_time(created),
                "updated_at": format_time(created),
                "private_gists": 0,
                "total_private_repos": 0,
                "owned_private_repos": 0,
                "disk_usage": 0,
                "collaborators": 0,
                "two_factor_authentication": true
            });
            if let Value::Object(extra) = extra {
                map.extend(extra);
            }
        }
        value
    }

    /// A repository (`full-repository`).
    pub fn repo_json(&self, repo: &Repo) -> Value {
        let full = repo.full_name();
        let api = format!("{}/repos/{full}", self.base_url);
        let html = format!("{HTML_BASE}/{full}");
        let open_issues = repo.items.values().filter(|i| i.open).count();
        let mut map = Map::new();
        let mut put = |k: &str, v: Value| {
            map.insert(k.to_owned(), v);
        };
        put("id", json!(repo.id));
        put("node_id", json!(node_id("Repository", repo.id)));
        put("name", json!(repo.name));
        put("full_name", json!(full));
        put("private", json!(false));
        put("owner", self.user_json(&repo.owner));
        put("html_url", json!(html));
        put("description", Value::Null);
        put("fork", json!(false));
        put("url", json!(api));
        for (field, suffix) in [
            ("forks_url", "/forks"),
            ("keys_url", "/keys{/key_id}"),
            ("collaborators_url", "/collaborators{/collaborator}"),
            ("teams_url", "/teams"),
            ("hooks_url", "/hooks"),
            ("issue_events_url", "/issues/events{/number}"),
            ("events_url", "/events"),
            ("assignees_url", "/assignees{/user}"),
            ("branches_url", "/branches{/branch}"),
            ("tags_url", "/tags"),
            ("blobs_url", "/git/blobs{/sha}"),
            ("git_tags_url", "/git/tags{/sha}"),
            ("git_refs_url", "/git/refs{/sha}"),
            ("trees_url", "/git/trees{/sha}"),
            ("statuses_url", "/statuses/{sha}"),
            ("languages_url", "/languages"),
            ("stargazers_url", "/stargazers"),
            ("contributors_url", "/contributors"),
            ("subscribers_url", "/subscribers"),
            ("subscription_url", "/subscription"),
            ("commits_url", "/commits{/sha}"),
            ("git_commits_url", "/git/commits{/sha}"),
            ("comments_url", "/comments{/number}"),
            ("issue_comment_url", "/issues/comments{/number}"),
            ("contents_url", "/contents/{+path}"),
            ("compare_url", "/compare/{base}...{head}"),
            ("merges_url", "/merges"),
            ("archive_url", "/{archive_format}{/ref}"),
            ("downloads_url", "/downloads"),
            ("issues_url", "/issues{/number}"),
            ("pulls_url", "/pulls{/number}"),
            ("milestones_url", "/milestones{/number}"),
            (
                "notifications_url",
                "/notifications{?since,all,participating}",
            ),
            ("labels_url", "/labels{/name}"),
            ("releases_url", "/releases{/id}"),
            ("deployments_url", "/deployments"),
        ] {
            put(field, json!(format!("{api}{suffix}")));
        }
        put("created_at", json!(format_time(repo.created_at)));
        put("updated_at", json!(format_time(repo.created_at)));
        put("pushed_at", json!(format_time(repo.created_at)));
        put("git_url", json!(format!("git://github.com/{full}.git")));
        put("ssh_url", json!(format!("git@github.com:{full}.git")));
        put(
            "clone_url",
            json!(
                repo.clone_url
                    .clone()
                    .unwrap_or_else(|| format!("{html}.git"))
            ),
        );
        put("svn_url", json!(html));
        put("homepage", Value::Null);
        put("size", json!(0));
        put("stargazers_count", json!(0));
        put("watchers_count", json!(0));
        put("language", Value::Null);
        put("has_issues", json!(true));
        put("has_projects", json!(true));
        put("has_downloads", json!(true));
        put("has_wiki", json!(true));
        put("has_pages", json!(false));
        put("has_discussions", json!(false));
        put("forks_count", json!(0));
        put("mirror_url", Value::Null);
        put("archived", json!(false));
        put("disabled", json!(false));
        put("open_issues_count", json!(open_issues));
        put("license", Value::Null);
        put("allow_forking", json!(true));
        put("is_template", json!(false));
        put("web_commit_signoff_required", json!(false));
        put("topics", json!([]));
        put("visibility", json!("public"));
        put("forks", json!(0));
        put("open_issues", json!(open_issues));
        put("watchers", json!(0));
        put("default_branch", json!(repo.default_branch));
        put(
            "permissions",
            json!({"admin": true, "maintain": true, "push": true, "triage": true, "pull": true}),
        );
        put("allow_squash_merge", json!(true));
        put("allow_merge_commit", json!(true));
        put("allow_rebase_merge", json!(true));
        put("allow_auto_merge", json!(false));
        put("delete_branch_on_merge", json!(false));
        put("allow_update_branch", json!(false));
        put("network_count", json!(0));
        put("subscribers_count", json!(0));
        Value::Object(map)
    }

    /// A label (`label`).
    pub fn label_json(&self, repo: &Repo, label: &Label) -> Value {
        json!({
            "id": label.id,
            "node_id": node_id("Label", label.id),
            "url": format!(
                "{}/repos/{}/labels/{}",
                self.base_url,
                repo.full_name(),
                percent_encode(&label.name)
            ),
            "name": label.name,
            "color": label.color,
            "default": false,
            "description": label.description
        })
    }

    /// The labels of an item, rendered.
    pub fn item_labels_json(&self, repo: &Repo, item: &Item) -> Vec<Value> {
        item.labels
            .iter()
            .map(|name| match repo.label(name) {
                Some(label) => self.label_json(repo, label),
                None => self.label_json(
                    repo,
                    &Label {
                        id: 0,
                        name: name.clone(),
                        color: DEFAULT_LABEL_COLOR.to_owned(),
                        description: None,
                    },
                ),
            })
            .collect()
    }

    /// The URLs of an issue or pull request, the one place the fake spells them.
    fn item_urls(&self, repo: &Repo, item: &Item) -> ItemUrls {
        let full_name = repo.full_name();
        let kind = if item.pull.is_some() {
            "pull"
        } else {
            "issues"
        };
        ItemUrls {
            issue_api: format!("{}/repos/{full_name}/issues/{}", self.base_url, item.number),
            pull_api: format!("{}/repos/{full_name}/pulls/{}", self.base_url, item.number),
            html: format!("{HTML_BASE}/{full_name}/{kind}/{}", item.number),
        }
    }

    fn association(repo: &Repo, login: &str) -> &'static str {
        if repo.owner.eq_ignore_ascii_case(login) {
            "OWNER"
        } else {
            "COLLABORATOR"
        }
    }

    /// The `reactions` roll-up of a subject: its url and a count per content.
    fn reactions_json<'r>(url: &str, reactions: impl Iterator<Item = &'r Reaction>) -> Value {
        let mut counts = [0usize; REACTION_CONTENTS.len()];
        let mut total = 0usize;
        for reaction in reactions {
            if let Some(i) = REACTION_CONTENTS
                .iter()
                .position(|c| *c == reaction.content)
                && let Some(count) = counts.get_mut(i)
            {
                *count += 1;
                total += 1;
            }
        }
        let mut map = Map::new();
        map.insert("url".to_owned(), json!(format!("{url}/reactions")));
        map.insert("total_count".to_owned(), json!(total));
        for (content, count) in REACTION_CONTENTS.iter().zip(counts) {
            map.insert((*content).to_owned(), json!(count));
        }
        Value::Object(map)
    }

    /// The reactions of one comment.
    fn reactions_of(
        repo: &Repo,
        comment_id: u64,
        review_comment: bool,
    ) -> impl Iterator<Item = &Reaction> {
        repo.reactions
            .iter()
            .filter(move |r| r.comment_id == comment_id && r.review_comment == review_comment)
    }

    /// An issue (`issue`); pull requests carry a `pull_request` object. `full` adds the
    /// members GitHub only writes on the single-issue endpoints.
    pub fn issue_json(&self, repo: &Repo, item: &Item, full: bool) -> Value {
        let urls = self.item_urls(repo, item);
        let api = &urls.issue_api;
        let mut value = json!({
            "url": api,
            "repository_url": format!("{}/repos/{}", self.base_url, repo.full_name()),
            "labels_url": format!("{api}/labels{{/name}}"),
            "comments_url": format!("{api}/comments"),
            "events_url": format!("{api}/events"),
            "html_url": urls.html,
            "id": item.id,
            "node_id": node_id("Issue", item.id),
            "number": item.number,
            "title": item.title,
            "user": self.user_json(&item.user),
            "labels": self.item_labels_json(repo, item),
            "state": if item.open { "open" } else { "closed" },
            "locked": false,
            "assignee": null,
            "assignees": [],
            "milestone": null,
            "comments": item.comments.len(),
            "created_at": format_time(item.created_at),
            "updated_at": format_time(item.updated_at),
            "closed_at": item.closed_at.map(format_time),
            "author_association": Self::association(repo, &item.user),
            "active_lock_reason": null,
            "body": item.body,
            "reactions": Self::reactions_json(api, std::iter::empty()),
            "timeline_url": format!("{api}/timeline"),
            "performed_via_github_app": null,
            "state_reason": item.state_reason
        });
        if let Value::Object(map) = &mut value {
            if let Some(pull) = &item.pull {
                let html = &urls.html;
                map.insert("draft".to_owned(), json!(pull.draft));
                map.insert(
                    "pull_request".to_owned(),
                    json!({
                        "url": urls.pull_api,
                        "html_url": html,
                        "diff_url": format!("{html}.diff"),
                        "patch_url": format!("{html}.patch"),
                        "merged_at": pull.merged_at.map(format_time)
                    }),
                );
            }
            if full {
                map.insert(
                    "closed_by".to_owned(),
                    item.closed_by
                        .as_deref()
                        .map_or(Value::Null, |login| self.user_json(login)),
                );
            }
        }
        value
    }

    /// An issue comment (`issue-comment`).
    pub fn comment_json(&self, repo: &Repo, item: &Item, comment: &Comment) -> Value {
        let urls = self.item_urls(repo, item);
        let url = format!(
            "{}/repos/{}/issues/comments/{}",
            self.base_url,
            repo.full_name(),
            comment.id
        );
        json!({
            "url": url,
            "html_url": format!("{}#issuecomment-{}", urls.html, comment.id),
            "issue_url": urls.issue_api,
            "id": comment.id,
            "node_id": node_id("IssueComment", comment.id),
            "user": self.user_json(&comment.user),
            "created_at": format_time(comment.created_at),
            "updated_at": format_time(comment.updated_at),
            "author_association": Self::association(repo, &comment.user),
            "body": comment.body,
            "reactions": Self::reactions_json(&url, Self::reactions_of(repo, comment.id, false)),
            "performed_via_github_app": null
        })
    }

    fn branch_json(&self, repo: &Repo, label: &str, r#ref: &str, sha: &str) -> Value {
        json!({
            "label": label,
            "ref": r#ref,
            "sha": sha,
            "user": self.user_json(&repo.owner),
            "repo": self.repo_json(repo)
        })
    }

    /// A pull request: `full` is the single-pull shape (`pull-request`), otherwise the list
    /// shape (`pull-request-simple`), which lacks `merged`, `mergeable`, counts and the like.
    pub fn pull_json(&self, repo: &Repo, item: &Item, pull: &Pull, full: bool) -> Value {
        let full_name = repo.full_name();
        let ItemUrls {
            issue_api,
            pull_api: api,
            html,
        } = self.item_urls(repo, item);
        let statuses = format!(
            "{}/repos/{full_name}/statuses/{}",
            self.base_url, pull.head_sha
        );
        let review_comment = format!(
            "{}/repos/{full_name}/pulls/comments{{/number}}",
            self.base_url
        );
        let links = json!({
            "self": {"href": api},
            "html": {"href": html},
            "issue": {"href": issue_api},
            "comments": {"href": format!("{issue_api}/comments")},
            "review_comments": {"href": format!("{api}/comments")},
            "review_comment": {"href": review_comment},
            "commits": {"href": format!("{api}/commits")},
            "statuses": {"href": statuses}
        });
        let head = self.branch_json(repo, &pull.head_label, &pull.head_ref, &pull.head_sha);
        let base = self.branch_json(
            repo,
            &format!("{}:{}", repo.owner, pull.base_ref),
            &pull.base_ref,
            &pull.base_sha,
        );
        let mut value = json!({
            "url": api,
            "id": pull.id,
            "node_id": node_id("PullRequest", pull.id),
            "html_url": html,
            "diff_url": format!("{html}.diff"),
            "patch_url": format!("{html}.patch"),
            "issue_url": issue_api,
            "number": item.number,
            "state": if item.open { "open" } else { "closed" },
            "locked": false,
            "title": item.title,
            "user": self.user_json(&item.user),
            "body": item.body,
            "created_at": format_time(item.created_at),
            "updated_at": format_time(item.updated_at),
            "closed_at": item.closed_at.map(format_time),
            "merged_at": pull.merged_at.map(format_time),
            "merge_commit_sha": pull.merge_commit_sha,
            "assignee": null,
            "assignees": [],
            "requested_reviewers": [],
            "requested_teams": [],
            "labels": self.item_labels_json(repo, item),
            "milestone": null,
            "draft": pull.draft,
            "commits_url": format!("{api}/commits"),
            "review_comments_url": format!("{api}/comments"),
            "review_comment_url": review_comment,
            "comments_url": format!("{issue_api}/comments"),
            "statuses_url": statuses,
            "head": head,
            "base": base,
            "_links": links,
            "author_association": Self::association(repo, &item.user),
            "auto_merge": null,
            "active_lock_reason": null
        });
        if full && let Value::Object(map) = &mut value {
            let merged = pull.merged_at.is_some();
            let extra = json!({
                "merged": merged,
                "mergeable": if item.open { json!(true) } else { Value::Null },
                "rebaseable": if item.open { json!(true) } else { Value::Null },
                "mergeable_state": if item.open { "clean" } else { "unknown" },
                "merged_by": pull.merged_by.as_deref().map_or(Value::Null, |l| self.user_json(l)),
                "comments": item.comments.len(),
                "review_comments": pull.review_comments.len(),
                "maintainer_can_modify": false,
                "commits": 1,
                "additions": 1,
                "deletions": 1,
                "changed_files": 1
            });
            if let Value::Object(extra) = extra {
                map.extend(extra);
            }
        }
        value
    }

    /// A pull-request review (`pull-request-review`); a pending review has no
    /// `submitted_at`, like GitHub's.
    pub fn review_json(&self, repo: &Repo, item: &Item, review: &Review) -> Value {
        let ItemUrls { pull_api, html, .. } = self.item_urls(repo, item);
        let html = format!("{html}#pullrequestreview-{}", review.id);
        let mut value = json!({
            "id": review.id,
            "node_id": node_id("PullRequestReview", review.id),
            "user": self.user_json(&review.user),
            "body": review.body,
            "state": review.state,
            "html_url": html,
            "pull_request_url": pull_api,
            "author_association": Self::association(repo, &review.user),
            "_links": {"html": {"href": html}, "pull_request": {"href": pull_api}},
            "submitted_at": format_time(review.submitted_at),
            "commit_id": review.commit_id
        });
        if review.state == "PENDING"
            && let Value::Object(map) = &mut value
        {
            map.remove("submitted_at");
        }
        value
    }

    /// A review comment (`pull-request-review-comment`), on the right side of the diff.
    pub fn review_comment_json(&self, repo: &Repo, item: &Item, comment: &ReviewComment) -> Value {
        let ItemUrls { pull_api, html, .. } = self.item_urls(repo, item);
        let url = format!(
            "{}/repos/{}/pulls/comments/{}",
            self.base_url,
            repo.full_name(),
            comment.id
        );
        let html = format!("{html}#discussion_r{}", comment.id);
        let hunk_start = comment.line.saturating_sub(1).max(1);
        json!({
            "url": url,
            "pull_request_review_id": comment.review_id,
            "id": comment.id,
            "node_id": node_id("PullRequestReviewComment", comment.id),
            "diff_hunk": format!(
                "@@ -{hunk_start},2 +{hunk_start},3 @@\n context\n+{}",
                comment.body.lines().next().unwrap_or_default()
            ),
            "path": comment.path,
            "position": 3,
            "original_position": 3,
            "commit_id": comment.commit_id,
            "original_commit_id": comment.commit_id,
            "user": self.user_json(&comment.user),
            "body": comment.body,
            "created_at": format_time(comment.created_at),
            "updated_at": format_time(comment.updated_at),
            "html_url": html,
            "pull_request_url": pull_api,
            "author_association": Self::association(repo, &comment.user),
            "_links": {
                "self": {"href": url},
                "html": {"href": html},
                "pull_request": {"href": pull_api}
            },
            "reactions": Self::reactions_json(&url, Self::reactions_of(repo, comment.id, true)),
            "start_line": null,
            "original_start_line": null,
            "start_side": null,
            "line": comment.line,
            "original_line": comment.line,
            "side": "RIGHT",
            "subject_type": "line",
            "performed_via_github_app": null
        })
    }

    /// A reaction (`reaction`).
    pub fn reaction_json(&self, reaction: &Reaction) -> Value {
        json!({
            "id": reaction.id,
            "node_id": node_id("Reaction", reaction.id),
            "user": self.user_json(&reaction.user),
            "content": reaction.content,
            "created_at": format_time(reaction.created_at)
        })
    }

    /// `GET …/collaborators/{username}/permission` (`repository-collaborator-permission`)
    /// for `login` with `role` (one of [`ROLES`]).
    pub fn permission_json(&self, login: &str, role: &str) -> Value {
        // The legacy summary: maintain counts as write, triage as read.
        let permission = match role {
            "admin" => "admin",
            "maintain" | "write" => "write",
            "triage" | "read" => "read",
            _ => "none",
        };
        let at_least = |r: &str| {
            let rank = |x: &str| ROLES.iter().position(|y| *y == x).unwrap_or(ROLES.len());
            rank(role) <= rank(r)
        };
        let mut user = self.user_json(login);
        if let Value::Object(map) = &mut user {
            map.insert(
                "permissions".to_owned(),
                json!({
                    "admin": at_least("admin"),
                    "maintain": at_least("maintain"),
                    "push": at_least("write"),
                    "triage": at_least("triage"),
                    "pull": at_least("read")
                }),
            );
            map.insert("role_name".to_owned(), json!(role));
        }
        json!({"permission": permission, "role_name": role, "user": user})
    }
}
