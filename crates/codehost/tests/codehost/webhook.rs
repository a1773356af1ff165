//! Webhook signatures and event parsing against GitHub's real payloads
//! (`tests/fixtures/github-webhooks`, see its README), plus properties: a signature made by
//! `sign` always verifies and nothing else does, and no input makes either function panic.

use agentry_codehost::webhook::{
    self, DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, SIGNATURE_PREFIX, parse_event, sign,
    verify_signature,
};
use agentry_codehost::{RepoRef, SignatureError, WebhookEvent};
use proptest::prelude::*;
use serde_json::{Value, json};
use time::macros::datetime;

const SECRET: &[u8] = b"It's a Secret to Everybody";

macro_rules! fixture {
    ($name:literal) => {
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/github-webhooks/",
            $name,
            ".payload.json"
        ))
        .as_slice()
    };
}

const PING: &[u8] = fixture!("ping");
const ISSUES_LABELED: &[u8] = fixture!("issues.labeled");
const ISSUES_OPENED: &[u8] = fixture!("issues.opened");
const ISSUES_OPENED_EMPTY_BODY: &[u8] = fixture!("issues.opened.with-empty-body");
const PR_CLOSED: &[u8] = fixture!("pull_request.closed");
const PR_OPENED: &[u8] = fixture!("pull_request.opened");
const PR_LABELED: &[u8] = fixture!("pull_request.labeled");
const PR_REOPENED: &[u8] = fixture!("pull_request.reopened");
const REVIEW_SUBMITTED: &[u8] = fixture!("pull_request_review.submitted");
const ISSUE_COMMENT_CREATED: &[u8] = fixture!("issue_comment.created");
const REVIEW_COMMENT_CREATED: &[u8] = fixture!("pull_request_review_comment.created");

/// Every fixture with the event it was delivered as.
const FIXTURES: [(&str, &[u8]); 11] = [
    ("ping", PING),
    ("issues", ISSUES_LABELED),
    ("issues", ISSUES_OPENED),
    ("issues", ISSUES_OPENED_EMPTY_BODY),
    ("pull_request", PR_CLOSED),
    ("pull_request", PR_OPENED),
    ("pull_request", PR_LABELED),
    ("pull_request", PR_REOPENED),
    ("pull_request_review", REVIEW_SUBMITTED),
    ("issue_comment", ISSUE_COMMENT_CREATED),
    ("pull_request_review_comment", REVIEW_COMMENT_CREATED),
];

/// The fake's `acme/widgets`.
fn acme_widgets() -> RepoRef {
    RepoRef {
        owner: "acme".into(),
        name: "widgets".into(),
        html_url: "https://github.com/acme/widgets".into(),
    }
}

fn hello_world() -> RepoRef {
    RepoRef {
        owner: "Codertocat".into(),
        name: "Hello-World".into(),
        html_url: "https://github.com/Codertocat/Hello-World".into(),
    }
}

/// `bytes` with `from` (which must occur exactly once) replaced by `to`.
fn edit(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    let text = std::str::from_utf8(bytes).unwrap();
    assert_eq!(text.matches(from).count(), 1, "{from:?} must occur once");
    text.replacen(from, to, 1).into_bytes()
}

/// The closed-without-merge fixture, edited byte for byte into a merge.
fn pr_merged_at(merged_at: &str) -> Vec<u8> {
    let merged = edit(PR_CLOSED, r#""merged": false"#, r#""merged": true"#);
    edit(
        &merged,
        r#""merged_at": null"#,
        &format!(r#""merged_at": "{merged_at}""#),
    )
}

/// `body` parsed, changed by `f`, and serialised again.
fn with_json(body: &[u8], f: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut value: Value = serde_json::from_slice(body).unwrap();
    f(&mut value);
    serde_json::to_vec(&value).unwrap()
}

fn other(event: &str, action: Option<&str>) -> WebhookEvent {
    WebhookEvent::Other {
        event: event.into(),
        action: action.map(str::to_owned),
    }
}

/// Asserts that `body` delivered as `event` parses as an event agentry does not act on,
/// with `action`.
#[track_caller]
fn assert_other(event: &str, body: &[u8], action: Option<&str>) {
    assert_eq!(parse_event(event, body).unwrap(), other(event, action));
}

// ---------------------------------------------------------------------------------------------
// Parsing the real payloads

#[test]
fn header_names_are_githubs() {
    assert_eq!(SIGNATURE_HEADER, "X-Hub-Signature-256");
    assert_eq!(EVENT_HEADER, "X-GitHub-Event");
    assert_eq!(DELIVERY_HEADER, "X-GitHub-Delivery");
    assert_eq!(SIGNATURE_PREFIX, "sha256=");
}

#[test]
fn ping_is_ping() {
    assert_eq!(
        parse_event("ping", PING).unwrap(),
        WebhookEvent::Ping {
            hook_id: Some(109_948_940),
            zen: Some("Anything added dilutes everything else.".into()),
        }
    );
    // Both members are informative only: a ping without them (or with odd ones) is a ping.
    assert_eq!(
        parse_event("ping", b"{}").unwrap(),
        WebhookEvent::Ping {
            hook_id: None,
            zen: None
        }
    );
    assert_eq!(
        parse_event("ping", br#"{"hook_id": "x", "zen": ["y"]}"#).unwrap(),
        WebhookEvent::Ping {
            hook_id: None,
            zen: None
        }
    );
}

#[test]
fn issues_labeled_is_issue_labeled_with_the_added_label() {
    let event = parse_event("issues", ISSUES_LABELED).unwrap();
    assert_eq!(
        event,
        WebhookEvent::IssueLabeled {
            repo: hello_world(),
            issue_number: 1,
            label: "bug".into(),
        }
    );
    assert_eq!(event.action(), Some("labeled"));
    // The label that was added is `label`, not whatever else the issue carries.
    let agentry = with_json(ISSUES_LABELED, |v| v["label"]["name"] = json!("agentry"));
    assert!(matches!(
        parse_event("issues", &agentry).unwrap(),
        WebhookEvent::IssueLabeled { label, .. } if label == "agentry"
    ));
}

#[test]
fn issues_opened_is_other() {
    for body in [ISSUES_OPENED, ISSUES_OPENED_EMPTY_BODY] {
        let event = parse_event("issues", body).unwrap();
        assert_eq!(event, other("issues", Some("opened")));
        assert_eq!(event.action(), Some("opened"));
    }
}

#[test]
fn pull_request_closed_without_merge() {
    assert_eq!(
        parse_event("pull_request", PR_CLOSED).unwrap(),
        WebhookEvent::PullRequestClosed {
            repo: hello_world(),
            number: 2,
            merged: false,
            merged_at: None,
            html_url: "https://github.com/Codertocat/Hello-World/pull/2".into(),
            head_ref: "changes".into(),
        }
    );
}

#[test]
fn pull_request_closed_by_a_merge() {
    let body = pr_merged_at("2019-05-15T15:21:18Z");
    assert_eq!(
        parse_event("pull_request", &body).unwrap(),
        WebhookEvent::PullRequestClosed {
            repo: hello_world(),
            number: 2,
            merged: true,
            merged_at: Some(datetime!(2019-05-15 15:21:18 UTC)),
            html_url: "https://github.com/Codertocat/Hello-World/pull/2".into(),
            head_ref: "changes".into(),
        }
    );
}

#[test]
fn merged_at_is_moved_to_utc() {
    let body = pr_merged_at("2019-05-15T17:21:18.5+02:00");
    let WebhookEvent::PullRequestClosed { merged_at, .. } =
        parse_event("pull_request", &body).unwrap()
    else {
        panic!("not a closed pull request");
    };
    let merged_at = merged_at.unwrap();
    assert_eq!(merged_at, datetime!(2019-05-15 15:21:18.5 UTC));
    assert!(merged_at.offset().is_utc());
}

#[test]
fn merged_is_true_when_either_member_says_so() {
    let closed = |body: &[u8]| match parse_event("pull_request", body).unwrap() {
        WebhookEvent::PullRequestClosed {
            merged, merged_at, ..
        } => (merged, merged_at),
        e => panic!("{e:?}"),
    };
    // `merged: true` alone (no `merged_at`): merged, time unknown.
    let flag_only = edit(PR_CLOSED, r#""merged": false"#, r#""merged": true"#);
    assert_eq!(closed(&flag_only), (true, None));
    // `merged_at` set and no `merged` member at all: merged (the poller's rule).
    let time_only = with_json(&pr_merged_at("2020-01-02T03:04:05Z"), |v| {
        v["pull_request"].as_object_mut().unwrap().remove("merged");
    });
    assert_eq!(
        closed(&time_only),
        (true, Some(datetime!(2020-01-02 03:04:05 UTC)))
    );
    // Neither member (nor `merged: null`): closed without merge.
    let neither = with_json(PR_CLOSED, |v| {
        let pr = v["pull_request"].as_object_mut().unwrap();
        pr.remove("merged_at");
        pr.insert("merged".into(), Value::Null);
    });
    assert_eq!(closed(&neither), (false, None));
}

#[test]
fn other_pull_request_actions_are_other() {
    assert_other("pull_request", PR_OPENED, Some("opened"));
    assert_other("pull_request", PR_LABELED, Some("labeled"));
    assert_other("pull_request", PR_REOPENED, Some("reopened"));
}

#[test]
fn pull_request_review_submitted_has_an_upper_case_state() {
    let event = parse_event("pull_request_review", REVIEW_SUBMITTED).unwrap();
    assert_eq!(
        event,
        WebhookEvent::PullRequestReviewSubmitted {
            repo: hello_world(),
            number: 2,
            review_id: 237_895_671,
            author: "Codertocat".into(),
            state: "CHANGES_REQUESTED".into(),
            body: "Please rename the section before this goes in.".into(),
            html_url:
                "https://github.com/Codertocat/Hello-World/pull/2#pullrequestreview-237895671"
                    .into(),
        }
    );
    assert_eq!(event.action(), Some("submitted"));
    // A review without a body (an approval, say) has `body: null`.
    let approved = with_json(REVIEW_SUBMITTED, |v| {
        v["review"]["state"] = json!("approved");
        v["review"]["body"] = Value::Null;
    });
    assert!(matches!(
        parse_event("pull_request_review", &approved).unwrap(),
        WebhookEvent::PullRequestReviewSubmitted { state, body, .. }
            if state == "APPROVED" && body.is_empty()
    ));
    // Other actions are ignored.
    let dismissed = with_json(REVIEW_SUBMITTED, |v| v["action"] = json!("dismissed"));
    assert_other("pull_request_review", &dismissed, Some("dismissed"));
}

#[test]
fn issue_comment_created_says_whether_it_is_on_a_pull_request() {
    let event = parse_event("issue_comment", ISSUE_COMMENT_CREATED).unwrap();
    assert_eq!(
        event,
        WebhookEvent::IssueCommentCreated {
            repo: hello_world(),
            issue_number: 2,
            is_pull_request: true,
            comment_id: 492_700_400,
            author: "Codertocat".into(),
            body: "@agentry please also update the changelog.".into(),
            html_url: "https://github.com/Codertocat/Hello-World/pull/2#issuecomment-492700400"
                .into(),
        }
    );
    assert_eq!(event.action(), Some("created"));
    // On a plain issue `issue.pull_request` is absent (or null).
    for change in [
        Change::Remove("issue.pull_request"),
        Change::Set("issue.pull_request", Value::Null),
    ] {
        assert!(matches!(
            parse_event("issue_comment", &change.made_to(ISSUE_COMMENT_CREATED)).unwrap(),
            WebhookEvent::IssueCommentCreated {
                is_pull_request: false,
                ..
            }
        ));
    }
    for action in ["edited", "deleted"] {
        let body = with_json(ISSUE_COMMENT_CREATED, |v| v["action"] = json!(action));
        assert_other("issue_comment", &body, Some(action));
    }
}

#[test]
fn pull_request_review_comment_created_has_the_line() {
    let event = parse_event("pull_request_review_comment", REVIEW_COMMENT_CREATED).unwrap();
    assert_eq!(
        event,
        WebhookEvent::ReviewCommentCreated {
            repo: hello_world(),
            number: 2,
            comment_id: 284_312_630,
            author: "Codertocat".into(),
            body: "Maybe you should use more emojji on this line.".into(),
            path: "README.md".into(),
            line: Some(1),
            html_url: "https://github.com/Codertocat/Hello-World/pull/2#discussion_r284312630"
                .into(),
        }
    );
    assert_eq!(event.action(), Some("created"));
    // An outdated comment has `line: null`: `original_line` stands in; a file comment has
    // neither.
    let outdated = with_json(REVIEW_COMMENT_CREATED, |v| {
        v["comment"]["line"] = Value::Null;
        v["comment"]["original_line"] = json!(7);
    });
    assert!(matches!(
        parse_event("pull_request_review_comment", &outdated).unwrap(),
        WebhookEvent::ReviewCommentCreated { line: Some(7), .. }
    ));
    let file = with_json(REVIEW_COMMENT_CREATED, |v| {
        v["comment"]["line"] = Value::Null;
        v["comment"]["original_line"] = Value::Null;
        v["comment"]["subject_type"] = json!("file");
    });
    assert!(matches!(
        parse_event("pull_request_review_comment", &file).unwrap(),
        WebhookEvent::ReviewCommentCreated { line: None, .. }
    ));
}

#[test]
fn new_events_missing_a_needed_member_are_errors_naming_it() {
    use Change::{Remove, Set};
    let cases: [(&str, &[u8], &str, &str, Change); 8] = [
        (
            "pull_request_review",
            REVIEW_SUBMITTED,
            "submitted",
            "review.state",
            Remove("review.state"),
        ),
        (
            "pull_request_review",
            REVIEW_SUBMITTED,
            "submitted",
            "review.user",
            Set("review.user", Value::Null),
        ),
        (
            "pull_request_review",
            REVIEW_SUBMITTED,
            "submitted",
            "pull_request.number",
            Set("pull_request.number", json!("2")),
        ),
        (
            "issue_comment",
            ISSUE_COMMENT_CREATED,
            "created",
            "comment.id",
            Remove("comment.id"),
        ),
        (
            "issue_comment",
            ISSUE_COMMENT_CREATED,
            "created",
            "issue.number",
            Set("issue.number", json!(-1)),
        ),
        (
            "issue_comment",
            ISSUE_COMMENT_CREATED,
            "created",
            "comment.html_url",
            Remove("comment.html_url"),
        ),
        (
            "pull_request_review_comment",
            REVIEW_COMMENT_CREATED,
            "created",
            "comment.path",
            Remove("comment.path"),
        ),
        (
            "pull_request_review_comment",
            REVIEW_COMMENT_CREATED,
            "created",
            "comment.line",
            Set("comment.line", json!("one")),
        ),
    ];
    for (event, fixture, action, member, change) in cases {
        let message = parse_error(event, &change.made_to(fixture));
        assert_names_member(&message, event, action, member);
    }
}

/// The event the fake's `payload` of `event` parses as.
#[track_caller]
fn parsed(event: &str, payload: &Value) -> WebhookEvent {
    parse_event(event, &serde_json::to_vec(payload).unwrap()).unwrap()
}

#[test]
fn the_fakes_payloads_parse_and_agree_with_its_state() {
    use agentry_fake_github::{FakeGitHub, payloads};
    let fake = FakeGitHub::start();
    fake.add_repo("acme", "widgets", "main");
    let pr = fake.add_pull("acme", "widgets", "Fix it", "agentry/issue-1", "main");
    let issue = fake.add_issue("acme", "widgets", "Bug", None, &[]);

    let review = fake.add_review("acme", "widgets", pr, "alice", "CHANGES_REQUESTED", "No.");
    let payload = payloads::pull_request_review_submitted(&fake, "acme", "widgets", pr, review);
    assert_eq!(payload["review"]["state"], "changes_requested");
    assert_eq!(
        parsed("pull_request_review", &payload),
        WebhookEvent::PullRequestReviewSubmitted {
            repo: acme_widgets(),
            number: pr,
            review_id: review,
            author: "alice".into(),
            state: "CHANGES_REQUESTED".into(),
            body: "No.".into(),
            html_url: format!(
                "https://github.com/acme/widgets/pull/{pr}#pullrequestreview-{review}"
            ),
        }
    );

    for (number, is_pr) in [(pr, true), (issue, false)] {
        let id = fake.add_comment("acme", "widgets", number, "bob", "@agentry again");
        let payload = payloads::issue_comment_created(&fake, "acme", "widgets", number, id);
        let kind = if is_pr { "pull" } else { "issues" };
        match parsed("issue_comment", &payload) {
            WebhookEvent::IssueCommentCreated {
                issue_number,
                is_pull_request,
                comment_id,
                author,
                body,
                html_url,
                ..
            } => {
                assert_eq!(
                    (issue_number, is_pull_request, comment_id),
                    (number, is_pr, id)
                );
                assert_eq!((author.as_str(), body.as_str()), ("bob", "@agentry again"));
                assert_eq!(
                    html_url,
                    format!("https://github.com/acme/widgets/{kind}/{number}#issuecomment-{id}")
                );
            }
            e => panic!("{e:?}"),
        }
    }

    let id = fake.add_review_comment("acme", "widgets", pr, "carol", "src/lib.rs", 42, "Typo.");
    let payload = payloads::pull_request_review_comment_created(&fake, "acme", "widgets", pr, id);
    assert_eq!(
        parsed("pull_request_review_comment", &payload),
        WebhookEvent::ReviewCommentCreated {
            repo: acme_widgets(),
            number: pr,
            comment_id: id,
            author: "carol".into(),
            body: "Typo.".into(),
            path: "src/lib.rs".into(),
            line: Some(42),
            html_url: format!("https://github.com/acme/widgets/pull/{pr}#discussion_r{id}"),
        }
    );
    // The payloads have the members of GitHub's.
    for key in ["action", "repository", "sender"] {
        assert!(payload.get(key).is_some(), "{key}");
    }
    assert_eq!(payload["comment"]["user"]["login"], "carol");
    assert_eq!(payload["pull_request"]["head"]["ref"], "agentry/issue-1");
}

#[test]
fn the_event_header_decides_not_the_body() {
    // An `issues.labeled` body announced as a pull-request event is a pull request `labeled`.
    assert_other("pull_request", ISSUES_LABELED, Some("labeled"));
    assert_other("issues", PR_CLOSED, Some("closed"));
    // Any body (a JSON object) under `ping` is a ping.
    assert!(matches!(
        parse_event("ping", PR_CLOSED).unwrap(),
        WebhookEvent::Ping { hook_id: None, .. }
    ));
    // Names are GitHub's, exactly: no case folding.
    assert_other("Issues", ISSUES_LABELED, Some("labeled"));
    // Events agentry does not act on, with and without an action.
    assert_other("push", br#"{"ref": "refs/heads/main"}"#, None);
    assert_other("issue_comment", br#"{"action": "edited"}"#, Some("edited"));
    assert_other("", b"{}", None);
    // A ping body under `issues` has no action: ignored, not an error.
    assert_other("issues", PING, None);
    // An action that is not a string is no action.
    assert_other("issues", br#"{"action": 7}"#, None);
}

#[test]
fn extra_and_unknown_members_change_nothing() {
    for (event, body) in FIXTURES {
        let expected = parse_event(event, body).unwrap();
        let extended = with_json(body, |v| {
            v["zzz_new_member"] = json!({"nested": [1, 2, {"x": null}]});
            v["repository"]["owner"]["new_field"] = json!(true);
            if v.get("pull_request").is_some() {
                v["pull_request"]["head"]["something_new"] = json!("value");
            }
            if v.get("label").is_some() {
                v["label"]["another"] = json!(1.5);
            }
        });
        assert_eq!(parse_event(event, &extended).unwrap(), expected, "{event}");
    }
    // Members agentry does not need may go missing, or change type, without harm.
    let trimmed = with_json(PR_CLOSED, |v| {
        let o = v.as_object_mut().unwrap();
        o.remove("sender");
        o.insert("number".into(), json!("two"));
        o["pull_request"]["user"] = json!(null);
    });
    assert!(matches!(
        parse_event("pull_request", &trimmed).unwrap(),
        WebhookEvent::PullRequestClosed { number: 2, .. }
    ));
}

// ---------------------------------------------------------------------------------------------
// Parse errors

#[test]
fn a_body_that_is_not_one_json_object_is_an_error_for_every_event() {
    let bodies: [&[u8]; 10] = [
        b"",
        b"   ",
        b"not json",
        b"[]",
        br#"[{"action": "labeled"}]"#,
        b"null",
        b"\"labeled\"",
        b"{} {}",
        b"{\"action\": \"labeled\"",
        b"\xff\xfe{}",
    ];
    for event in ["ping", "issues", "pull_request", "push", ""] {
        for body in bodies {
            let e = parse_event(event, body).unwrap_err();
            assert!(
                e.to_string().starts_with("webhook payload: "),
                "{event} {body:?}: {e}"
            );
        }
    }
    // A truncated real payload.
    assert!(parse_event("pull_request", &PR_CLOSED[..PR_CLOSED.len() / 2]).is_err());
}

/// A change made to a payload's JSON, at a dotted path of members.
enum Change {
    /// Removes the member.
    Remove(&'static str),
    /// Sets the member to the value.
    Set(&'static str, Value),
}

impl Change {
    /// `body` with this change made.
    fn made_to(self, body: &[u8]) -> Vec<u8> {
        with_json(body, |v| {
            let (path, value) = match self {
                Change::Remove(path) => (path, None),
                Change::Set(path, value) => (path, Some(value)),
            };
            let (parent, leaf) = match path.rsplit_once('.') {
                Some((parent, leaf)) => (format!("/{}", parent.replace('.', "/")), leaf),
                None => (String::new(), path),
            };
            let parent = v
                .pointer_mut(&parent)
                .and_then(Value::as_object_mut)
                .unwrap_or_else(|| panic!("no object at {path}"));
            match value {
                None => parent.remove(leaf),
                Some(value) => parent.insert(leaf.to_owned(), value),
            };
        })
    }
}

/// The error of `parse_event(event, body)`, which must fail.
/// Asserts that the parse error `message` names the `event`, its `action` and the `member`
/// (a dotted path), or its parent missing its last part.
#[track_caller]
fn assert_names_member(message: &str, event: &str, action: &str, member: &str) {
    assert!(
        message.contains(&format!("`{event}` event, action `{action}`")),
        "{message}"
    );
    let (parent, leaf) = member.rsplit_once('.').unwrap_or(("", member));
    assert!(
        message.contains(member) || message.contains(&format!("{parent}: missing field `{leaf}`")),
        "{member}: {message}"
    );
}

fn parse_error(event: &str, body: &[u8]) -> String {
    match parse_event(event, body) {
        Ok(e) => panic!("parsed as {e:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn an_issue_labeled_missing_a_needed_member_is_an_error_naming_it() {
    use Change::{Remove, Set};
    let cases: [(&str, Change); 6] = [
        ("label", Remove("label")),
        ("label.name", Remove("label.name")),
        ("issue.number", Set("issue.number", json!("1"))),
        ("repository.owner.login", Remove("repository.owner.login")),
        (
            "repository.html_url",
            Set("repository.html_url", json!(null)),
        ),
        (
            "repository",
            Set("repository", json!(["Codertocat", "Hello-World"])),
        ),
    ];
    for (member, change) in cases {
        let message = parse_error("issues", &change.made_to(ISSUES_LABELED));
        assert!(message.contains("`issues`"), "{message}");
        assert!(message.contains("`labeled`"), "{message}");
        let leaf = member.rsplit('.').next().unwrap();
        assert!(
            message.contains(member) || message.contains(&format!("`{leaf}`")),
            "{member}: {message}"
        );
    }
}

#[test]
fn a_pull_request_closed_missing_a_needed_member_is_an_error_naming_it() {
    use Change::{Remove, Set};
    let cases: [(&str, Change); 7] = [
        ("pull_request", Remove("pull_request")),
        ("pull_request.number", Remove("pull_request.number")),
        ("pull_request.number", Set("pull_request.number", json!(-2))),
        ("pull_request.html_url", Remove("pull_request.html_url")),
        ("pull_request.head", Remove("pull_request.head.ref")),
        (
            "pull_request.merged_at",
            Set("pull_request.merged_at", json!("yesterday")),
        ),
        (
            "pull_request.merged",
            Set("pull_request.merged", json!("yes")),
        ),
    ];
    for (member, change) in cases {
        let message = parse_error("pull_request", &change.made_to(PR_CLOSED));
        assert_names_member(&message, "pull_request", "closed", member);
    }
}

// ---------------------------------------------------------------------------------------------
// Signatures

#[test]
fn the_right_signature_verifies() {
    for (_, body) in FIXTURES {
        let header = sign(SECRET, body);
        assert_eq!(verify_signature(SECRET, body, Some(&header)), Ok(()));
    }
}

#[test]
fn sign_is_sha256_prefix_and_64_lower_case_hex_digits() {
    let header = sign(SECRET, PING);
    let hex = header.strip_prefix("sha256=").unwrap();
    assert_eq!(hex.len(), 64);
    assert!(
        hex.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    // GitHub's documented example ("Validating webhook deliveries").
    assert_eq!(
        sign(SECRET, b"Hello, World!"),
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    );
}

#[test]
fn upper_and_mixed_case_hex_verify() {
    let header = sign(SECRET, PR_CLOSED);
    let hex = header.strip_prefix("sha256=").unwrap();
    let upper = format!("sha256={}", hex.to_ascii_uppercase());
    assert_eq!(verify_signature(SECRET, PR_CLOSED, Some(&upper)), Ok(()));
    let mixed: String = hex
        .chars()
        .enumerate()
        .map(|(i, c)| {
            if i % 2 == 0 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect();
    let mixed = format!("sha256={mixed}");
    assert_eq!(verify_signature(SECRET, PR_CLOSED, Some(&mixed)), Ok(()));
}

#[test]
fn a_body_altered_after_signing_is_a_mismatch() {
    let header = sign(SECRET, PR_CLOSED);
    let merged = pr_merged_at("2019-05-15T15:21:18Z");
    assert_eq!(
        verify_signature(SECRET, &merged, Some(&header)),
        Err(SignatureError::Mismatch)
    );
    let mut flipped = PR_CLOSED.to_vec();
    flipped[PR_CLOSED.len() / 2] ^= 1;
    assert_eq!(
        verify_signature(SECRET, &flipped, Some(&header)),
        Err(SignatureError::Mismatch)
    );
    let mut appended = PR_CLOSED.to_vec();
    appended.push(b'\n');
    assert_eq!(
        verify_signature(SECRET, &appended, Some(&header)),
        Err(SignatureError::Mismatch)
    );
    assert_eq!(
        verify_signature(SECRET, &PR_CLOSED[1..], Some(&header)),
        Err(SignatureError::Mismatch)
    );
}

#[test]
fn a_signature_made_with_another_secret_is_a_mismatch() {
    let header = sign(b"another secret", ISSUES_LABELED);
    assert_eq!(
        verify_signature(SECRET, ISSUES_LABELED, Some(&header)),
        Err(SignatureError::Mismatch)
    );
    assert_eq!(
        verify_signature(b"", ISSUES_LABELED, Some(&sign(SECRET, ISSUES_LABELED))),
        Err(SignatureError::Mismatch)
    );
    // A secret differing only by a trailing byte is another secret. (Not a trailing NUL: HMAC
    // pads short keys with zeros, so `k` and `k\0` are the same key, for GitHub as for us.)
    let mut longer = SECRET.to_vec();
    longer.push(b'!');
    let mut padded = SECRET.to_vec();
    padded.push(0);
    assert_eq!(
        verify_signature(&padded, PING, Some(&sign(SECRET, PING))),
        Ok(())
    );
    assert_eq!(
        verify_signature(&longer, PING, Some(&sign(SECRET, PING))),
        Err(SignatureError::Mismatch)
    );
}

#[test]
fn a_missing_header_is_missing() {
    assert_eq!(
        verify_signature(SECRET, PING, None),
        Err(SignatureError::Missing)
    );
    assert_eq!(
        verify_signature(SECRET, b"", None),
        Err(SignatureError::Missing)
    );
}

#[test]
fn a_malformed_header_is_malformed() {
    let good = sign(SECRET, PING);
    let hex = good.strip_prefix("sha256=").unwrap();
    let sha1_hex = &hex[..40];
    let malformed = [
        String::new(),
        "sha256=".to_owned(),
        format!("sha1={sha1_hex}"),
        format!("sha1={hex}"),
        format!("SHA256={hex}"),
        format!("sha256:{hex}"),
        hex.to_owned(),
        format!("sha256={}", &hex[..62]),  // short, even length
        format!("sha256={}", &hex[..63]),  // short, odd length
        format!("sha256={hex}0"),          // long, odd length
        format!("sha256={hex}00"),         // long, even length
        format!("sha256={}g", &hex[..63]), // not hex
        format!("sha256={}+1", &hex[..62]),
        format!("sha256=0x{}", &hex[..62]),
        format!("sha256={}é", &hex[..62]), // 64 bytes, not hex
        format!(" {good}"),
        format!("{good} "),
        format!("{good}\n"),
        format!("sha256= {}", &hex[..63]),
        format!("{good},{good}"),
    ];
    for header in malformed {
        assert_eq!(
            verify_signature(SECRET, PING, Some(&header)),
            Err(SignatureError::Malformed),
            "{header:?}"
        );
    }
}

#[test]
fn empty_bodies() {
    // An empty body correctly signed verifies (the caller then refuses to parse it).
    let empty = sign(SECRET, b"");
    assert_eq!(verify_signature(SECRET, b"", Some(&empty)), Ok(()));
    // An empty body with the signature of a non-empty one does not.
    assert_eq!(
        verify_signature(SECRET, b"", Some(&sign(SECRET, PING))),
        Err(SignatureError::Mismatch)
    );
    assert_eq!(
        verify_signature(SECRET, PING, Some(&empty)),
        Err(SignatureError::Mismatch)
    );
    // The function itself allows an empty secret.
    assert_eq!(verify_signature(b"", PING, Some(&sign(b"", PING))), Ok(()));
}

#[test]
fn error_messages_are_human() {
    for e in [
        SignatureError::Missing,
        SignatureError::Malformed,
        SignatureError::Mismatch,
    ] {
        let message = e.to_string();
        assert!(message.contains("X-Hub-Signature-256"), "{message}");
    }
    assert_eq!(
        webhook::WebhookParseError("x".into()).to_string(),
        "webhook payload: x"
    );
}

// ---------------------------------------------------------------------------------------------
// Properties

fn event_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("ping".to_owned()),
        Just("issues".to_owned()),
        Just("pull_request".to_owned()),
        Just("pull_request_review".to_owned()),
        Just("issue_comment".to_owned()),
        Just("pull_request_review_comment".to_owned()),
        ".{0,20}",
    ]
}

/// JSON documents built from the members agentry reads, with values of every type, so that
/// the recognised events' paths are exercised with arbitrary shapes.
fn json_shaped() -> impl Strategy<Value = Value> {
    let key = prop::sample::select(vec![
        "action",
        "repository",
        "owner",
        "login",
        "name",
        "html_url",
        "issue",
        "number",
        "label",
        "pull_request",
        "merged",
        "merged_at",
        "head",
        "ref",
        "hook_id",
        "zen",
        "review",
        "comment",
        "user",
        "state",
        "body",
        "id",
        "path",
        "line",
        "original_line",
        "other",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(vec![
            "labeled",
            "closed",
            "opened",
            "submitted",
            "created",
            "2019-05-15T15:21:18Z",
            "2019-13-45T99:99:99Z",
            "+99999-01-01T00:00:00Z",
            "",
        ])
        .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec((key.clone(), inner), 0..8).prop_map(|members| {
                Value::Object(
                    members
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect(),
                )
            }),
        ]
    })
}

/// A real payload damaged once: truncated, a byte replaced, or bytes inserted.
fn damaged_fixture() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(FIXTURES.to_vec()),
        any::<prop::sample::Index>(),
        0u8..3,
        prop::collection::vec(any::<u8>(), 1..4),
    )
        .prop_map(|((_, body), at, how, bytes)| {
            let mut body = body.to_vec();
            let i = at.index(body.len());
            match how {
                0 => body.truncate(i),
                1 => body[i] = bytes[0],
                _ => {
                    body.splice(i..i, bytes);
                }
            }
            body
        })
}

fn check_parse(event: &str, body: &[u8]) {
    if let Ok(WebhookEvent::Other { event: e, .. }) = parse_event(event, body) {
        assert_eq!(e, event);
    }
}

proptest! {
    #[test]
    fn verify_signature_never_panics_and_accepts_only_the_right_digest(
        secret in prop::collection::vec(any::<u8>(), 0..80),
        body in prop::collection::vec(any::<u8>(), 0..200),
        header in prop::option::of(prop_oneof![
            ".{0,80}",
            "sha256=[0-9a-fA-F]{0,70}",
            "sha256=[0-9a-f]{64}",
        ]),
    ) {
        let result = verify_signature(&secret, &body, header.as_deref());
        match header {
            None => prop_assert_eq!(result, Err(SignatureError::Missing)),
            Some(header) if result.is_ok() => {
                prop_assert!(header.starts_with("sha256="));
                prop_assert_eq!(header.to_ascii_lowercase(), sign(&secret, &body));
            }
            Some(_) => {}
        }
    }

    #[test]
    fn sign_then_verify_round_trips_and_any_change_is_caught(
        secret in prop::collection::vec(any::<u8>(), 0..200),
        body in prop::collection::vec(any::<u8>(), 0..300),
        at in any::<prop::sample::Index>(),
    ) {
        let header = sign(&secret, &body);
        prop_assert_eq!(verify_signature(&secret, &body, Some(&header)), Ok(()));
        let mut changed = body.clone();
        if changed.is_empty() {
            changed.push(0);
        } else {
            let i = at.index(changed.len());
            changed[i] ^= 0x80;
        }
        prop_assert_eq!(
            verify_signature(&secret, &changed, Some(&header)),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn parse_event_never_panics_on_arbitrary_bytes(
        event in event_name(),
        body in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        check_parse(&event, &body);
    }

    #[test]
    fn parse_event_never_panics_on_arbitrary_json(event in event_name(), doc in json_shaped()) {
        check_parse(&event, &serde_json::to_vec(&doc).unwrap());
    }

    #[test]
    fn parse_event_never_panics_on_damaged_payloads(
        event in event_name(),
        body in damaged_fixture(),
    ) {
        check_parse(&event, &body);
    }
}
