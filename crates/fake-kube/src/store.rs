//! The object store: every object a `serde_json::Value`, one global `resourceVersion`
//! counter, and a bounded window of watch events.

use std::collections::{BTreeMap, HashSet, VecDeque};

use serde_json::{Value, json};

/// A resource type the fake serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    /// The plural name in URLs (`pods`).
    pub name: &'static str,
    /// The API group (`""` for the core group).
    pub group: &'static str,
    /// The version (`v1`).
    pub version: &'static str,
    /// The kind (`Pod`).
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// kubectl's short names.
    pub short: &'static [&'static str],
    /// The verbs discovery lists.
    pub verbs: &'static [&'static str],
}

const OBJECT_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Every resource the fake serves.
pub const RESOURCES: &[Resource] = &[
    Resource {
        name: "namespaces",
        group: "",
        version: "v1",
        kind: "Namespace",
        namespaced: false,
        short: &["ns"],
        verbs: &[
            "create", "delete", "get", "list", "patch", "update", "watch",
        ],
    },
    Resource {
        name: "pods",
        group: "",
        version: "v1",
        kind: "Pod",
        namespaced: true,
        short: &["po"],
        verbs: OBJECT_VERBS,
    },
    Resource {
        name: "secrets",
        group: "",
        version: "v1",
        kind: "Secret",
        namespaced: true,
        short: &[],
        verbs: OBJECT_VERBS,
    },
    Resource {
        name: "configmaps",
        group: "",
        version: "v1",
        kind: "ConfigMap",
        namespaced: true,
        short: &["cm"],
        verbs: OBJECT_VERBS,
    },
    Resource {
        name: "jobs",
        group: "batch",
        version: "v1",
        kind: "Job",
        namespaced: true,
        short: &[],
        verbs: OBJECT_VERBS,
    },
    Resource {
        name: "selfsubjectaccessreviews",
        group: "authorization.k8s.io",
        version: "v1",
        kind: "SelfSubjectAccessReview",
        namespaced: false,
        short: &[],
        verbs: &["create"],
    },
];

/// The resource named `name` in `group`, if the fake serves it.
pub fn resource(group: &str, name: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.name == name)
}

/// The `apiVersion` of a resource's objects.
pub fn api_version(r: &Resource) -> String {
    if r.group.is_empty() {
        r.version.to_owned()
    } else {
        format!("{}/{}", r.group, r.version)
    }
}

/// An API error, answered as a `Status` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status code.
    pub code: u16,
    /// The `reason` (`NotFound`, `AlreadyExists`, `Invalid`, …).
    pub reason: &'static str,
    /// The message.
    pub message: String,
    /// `details`: the object's name, group and kind, where one is concerned.
    pub details: Option<(String, String, String)>,
}

impl ApiError {
    /// A 404 for `name` of `r`.
    pub fn not_found(r: &Resource, name: &str) -> Self {
        Self {
            code: 404,
            reason: "NotFound",
            message: format!("{} \"{name}\" not found", qualified(r)),
            details: Some((name.to_owned(), r.group.to_owned(), r.name.to_owned())),
        }
    }

    /// A 422 `Invalid` for `name` of `r`.
    pub fn invalid(r: &Resource, name: &str, problem: &str) -> Self {
        Self {
            code: 422,
            reason: "Invalid",
            message: format!("{} \"{name}\" is invalid: {problem}", r.kind),
            details: Some((name.to_owned(), r.group.to_owned(), r.kind.to_owned())),
        }
    }

    /// A 400 `BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            code: 400,
            reason: "BadRequest",
            message: message.into(),
            details: None,
        }
    }

    /// Any other error.
    pub fn other(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some((name, group, kind)) = &self.details {
            status["details"] = json!({"name": name, "group": group, "kind": kind});
        }
        status
    }
}

/// `pods` or `jobs.batch`: how the real server names a resource in messages.
pub fn qualified(r: &Resource) -> String {
    if r.group.is_empty() {
        r.name.to_owned()
    } else {
        format!("{}.{}", r.name, r.group)
    }
}

/// The store's key: resource, namespace (`""` for cluster objects), name.
pub type Key = (&'static str, String, String);

/// One watch event.
#[derive(Debug, Clone)]
pub struct Event {
    /// The `resourceVersion` the write made.
    pub rv: u64,
    /// The resource.
    pub resource: &'static str,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    /// The object after the write (before it, for `DELETED`, with the new version).
    pub object: Value,
}

/// One request the fake answered (for tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// The method.
    pub method: String,
    /// The path and query.
    pub uri: String,
    /// The status code answered (for a watch, that of its head).
    pub status: u16,
    /// Whether it failed by a fault of [`crate::FakeKube::fail_next`].
    pub faulted: bool,
}

/// All objects and the event window.
#[derive(Debug)]
pub struct Store {
    /// The last `resourceVersion` given out.
    pub rv: u64,
    /// The objects.
    pub objects: BTreeMap<Key, Value>,
    /// The last events, oldest first.
    pub events: VecDeque<Event>,
    /// How many events the window keeps.
    pub window: usize,
    /// The highest version of an event dropped from the window.
    pub expired_upto: u64,
    /// The uids of pods the kubelet is holding (running or about to).
    pub kubelet_pods: HashSet<String>,
    /// The requests answered.
    pub requests: Vec<RequestRecord>,
    /// Wakes watches, the controllers and the kubelet after every write.
    pub changed: tokio::sync::watch::Sender<u64>,
}

/// Now, as the API writes timestamps (RFC 3339, seconds).
pub fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second()
    )
}

/// Parses an RFC 3339 timestamp.
pub fn parse_time(text: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()
}

impl Store {
    /// An empty store keeping `window` events.
    pub fn new(window: usize) -> Self {
        let (changed, _) = tokio::sync::watch::channel(0);
        Self {
            rv: 0,
            objects: BTreeMap::new(),
            events: VecDeque::new(),
            window: window.max(1),
            expired_upto: 0,
            kubelet_pods: HashSet::new(),
            requests: Vec::new(),
            changed,
        }
    }

    fn emit(&mut self, resource: &'static str, kind: &'static str, object: Value) {
        self.events.push_back(Event {
            rv: self.rv,
            resource,
            kind,
            object,
        });
        while self.events.len() > self.window {
            if let Some(dropped) = self.events.pop_front() {
                self.expired_upto = dropped.rv;
            }
        }
        self.changed.send_replace(self.rv);
    }

    /// The object at `key`.
    pub fn get(&self, resource: &'static str, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&(resource, ns.to_owned(), name.to_owned()))
    }

    /// Stores a new object (metadata already complete but for the server's fields).
    pub fn insert(&mut self, r: &Resource, ns: &str, mut object: Value) -> Value {
        self.rv += 1;
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        object["apiVersion"] = json!(api_version(r));
        object["kind"] = json!(r.kind);
        let meta = &mut object["metadata"];
        if !meta["uid"].is_string() {
            meta["uid"] = json!(uuid::Uuid::new_v4().to_string());
        }
        meta["resourceVersion"] = json!(self.rv.to_string());
        meta["creationTimestamp"] = json!(now_rfc3339());
        meta["generation"] = json!(1);
        if r.namespaced {
            meta["namespace"] = json!(ns);
        }
        self.objects
            .insert((r.name, ns.to_owned(), name), object.clone());
        self.emit(r.name, "ADDED", object.clone());
        object
    }

    /// Replaces an existing object; bumps `generation` when its `spec` changed.
    pub fn update(&mut self, r: &Resource, ns: &str, mut object: Value) -> Value {
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let key = (r.name, ns.to_owned(), name);
        if let Some(old) = self.objects.get(&key)
            && old.get("spec") != object.get("spec")
        {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
            object["metadata"]["generation"] = json!(generation + 1);
        }
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.objects.insert(key, object.clone());
        self.emit(r.name, "MODIFIED", object.clone());
        object
    }

    /// Changes an object in place with `change`, if it exists; returns the new object.
    pub fn modify(
        &mut self,
        r: &Resource,
        ns: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        let mut object = self.get(r.name, ns, name)?.clone();
        let before = object.clone();
        change(&mut object);
        if object == before {
            return Some(object);
        }
        Some(self.update(r, ns, object))
    }

    /// Removes an object for good.
    pub fn remove(&mut self, r: &Resource, ns: &str, name: &str) -> Option<Value> {
        let mut object = self
            .objects
            .remove(&(r.name, ns.to_owned(), name.to_owned()))?;
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.emit(r.name, "DELETED", object.clone());
        Some(object)
    }

    /// The objects of `resource` in `ns` (all namespaces with `None`).
    pub fn list(&self, resource: &'static str, ns: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((r, n, _), _)| *r == resource && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Whether an object with `uid` exists (any resource).
    pub fn uid_exists(&self, uid: &str) -> bool {
        self.objects
            .values()
            .any(|o| o["metadata"]["uid"].as_str() == Some(uid))
    }
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (`a=b,c!=d,e in (f,g),h,!i`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

fn split_top(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts
        .into_iter()
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

impl LabelSelector {
    /// Parses a selector, or says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for term in split_top(text) {
            let bad = || format!("unable to parse requirement: {term:?}");
            let set = |rest: &str| -> Result<Vec<String>, String> {
                let inner = rest
                    .trim()
                    .strip_prefix('(')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(bad)?;
                Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
            };
            let requirement = if let Some(key) = term.strip_prefix('!') {
                Requirement::NotExists(key.trim().to_owned())
            } else if let Some((key, rest)) = term.split_once(" notin ") {
                Requirement::NotIn(key.trim().to_owned(), set(rest)?)
            } else if let Some((key, rest)) = term.split_once(" in ") {
                Requirement::In(key.trim().to_owned(), set(rest)?)
            } else if let Some((key, value)) = term.split_once("!=") {
                Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = term.split_once("==") {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = term.split_once('=') {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else {
                Requirement::Exists(term.clone())
            };
            let key = match &requirement {
                Requirement::Equals(k, _)
                | Requirement::NotEquals(k, _)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::NotExists(k) => k,
            };
            if !valid_key(key) {
                return Err(bad());
            }
            requirements.push(requirement);
        }
        Ok(Self(requirements))
    }

    /// Whether `object`'s labels match.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
        })
    }
}

/// A parsed field selector: `metadata.name`, `metadata.namespace`, `status.phase` and
/// `spec.nodeName` with `=`, `==` or `!=`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses a selector, or says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                ));
            };
            if ![
                "metadata.name",
                "metadata.namespace",
                "status.phase",
                "spec.nodeName",
            ]
            .contains(&field)
            {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field.to_owned(), equal, value.to_owned()));
        }
        Ok(Self(terms))
    }

    /// Whether `object` matches.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let actual = field
                .split('.')
                .fold(object, |v, part| &v[part])
                .as_str()
                .unwrap_or_default();
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_match_as_the_api_does() {
        let pod = json!({"metadata": {"labels": {"app": "a", "tier": "web"}}});
        let yes = [
            "app=a",
            "app==a",
            "app!=b",
            "app in (a,b)",
            "x notin (a)",
            "tier",
            "!x",
            "app=a,tier in (web, db)",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).expect(s).matches(&pod), "{s}");
        }
        let no = [
            "app=b",
            "app!=a",
            "app in (b)",
            "app notin (a)",
            "x",
            "!app",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).expect(s).matches(&pod), "{s}");
        }
        assert!(LabelSelector::parse("a in b").is_err());
        assert!(LabelSelector::parse("a b=c").is_err());
    }

    #[test]
    fn field_selectors_match_names() {
        let pod = json!({"metadata": {"name": "p"}});
        assert!(
            FieldSelector::parse("metadata.name=p")
                .expect("p")
                .matches(&pod)
        );
        assert!(
            !FieldSelector::parse("metadata.name!=p")
                .expect("p")
                .matches(&pod)
        );
        assert!(FieldSelector::parse("spec.foo=1").is_err());
    }

    #[test]
    fn the_window_drops_old_events() {
        let mut store = Store::new(2);
        let r = resource("", "secrets").expect("secrets");
        for name in ["a", "b", "c"] {
            store.insert(r, "default", json!({"metadata": {"name": name}}));
        }
        assert_eq!(store.events.len(), 2);
        assert_eq!(store.expired_upto, 1);
    }
}
