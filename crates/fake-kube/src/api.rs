//! The HTTP API: discovery, objects, watches, logs, access reviews.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::Shared;
use crate::controller;
use crate::fault::{self, Fault};
use crate::rbac::Attributes;
use crate::store::{self, ApiError, FieldSelector, LabelSelector, Resource, Store};

type Query = HashMap<String, String>;

pub(crate) fn json_response(code: u16, body: &Value) -> HttpResponse {
    HttpResponse::build(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .content_type("application/json")
        .body(body.to_string())
}

fn error_response(e: &ApiError) -> HttpResponse {
    json_response(e.code, &e.status())
}

/// Whether `name` is a DNS-1123 subdomain of at most `max` characters.
pub fn valid_name(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// Five characters as the API server's `generateName` appends.
pub fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

/// A namespace as the fake creates it at start.
pub fn default_namespace(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

fn discovery_group(group: &str, version: &str) -> Value {
    let resources: Vec<Value> = store::RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .flat_map(|r| {
            let mut out = vec![json!({
                "name": r.name,
                "singularName": r.kind.to_lowercase(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": r.verbs,
                "shortNames": r.short,
            })];
            let subs: &[&str] = match r.name {
                "pods" => &["status", "log"],
                "jobs" => &["status"],
                _ => &[],
            };
            for sub in subs {
                let (kind, verbs): (&str, &[&str]) = if *sub == "log" {
                    ("Pod", &["get"])
                } else {
                    (r.kind, &["get", "patch", "update"])
                };
                out.push(json!({
                    "name": format!("{}/{sub}", r.name),
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": kind,
                    "verbs": verbs,
                }));
            }
            out
        })
        .collect();
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    })
}

fn groups() -> Value {
    let groups: Vec<Value> = ["batch", "authorization.k8s.io"]
        .iter()
        .map(|g| {
            let gv = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// What a request addresses.
#[derive(Debug)]
struct Target {
    resource: &'static Resource,
    namespace: String,
    name: String,
    subresource: String,
}

fn parse_target(path: &str) -> Result<Option<Target>, ApiError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, "v1", rest @ ..] => (*group, rest),
        _ => return Ok(None),
    };
    let not_found = || {
        ApiError::other(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, res, rest @ ..] if !res.is_empty() => (ns.to_string(), {
            let mut v = vec![*res];
            v.extend_from_slice(rest);
            v
        }),
        rest => (String::new(), rest.to_vec()),
    };
    let (resource, name, subresource) = match rest.as_slice() {
        [res] => (*res, "", ""),
        [res, name] => (*res, *name, ""),
        [res, name, sub] => (*res, *name, *sub),
        _ => return Err(not_found()),
    };
    let resource = store::resource(group, resource).ok_or_else(not_found)?;
    if resource.namespaced && namespace.is_empty() && !name.is_empty() {
        return Err(not_found());
    }
    if !resource.namespaced && !namespace.is_empty() {
        return Err(not_found());
    }
    if !subresource.is_empty()
        && !matches!(
            (resource.name, subresource),
            ("pods", "log" | "status") | ("jobs", "status")
        )
    {
        return Err(not_found());
    }
    Ok(Some(Target {
        resource,
        namespace,
        name: name.to_owned(),
        subresource: subresource.to_owned(),
    }))
}

fn verb(method: &str, target: &Target, query: &Query) -> &'static str {
    let watch = query.get("watch").is_some_and(|w| w == "1" || w == "true");
    match (method, target.name.is_empty()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "list",
        ("GET", false) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "deletecollection",
        ("DELETE", false) => "delete",
        _ => "unknown",
    }
}

/// Answers every request, or fails it as a fault of [`crate::FakeKube::fail_next`] says.
pub async fn handle(req: HttpRequest, body: Bytes, shared: web::Data<Arc<Shared>>) -> HttpResponse {
    let shared = shared.get_ref().clone();
    let resource = match parse_target(req.path()) {
        Ok(Some(target)) if target.subresource.is_empty() => Some(target.resource.name.to_owned()),
        Ok(Some(target)) => Some(format!("{}/{}", target.resource.name, target.subresource)),
        Ok(None) | Err(_) => None,
    };
    let fault = shared
        .faults
        .lock()
        .take(req.method().as_str(), resource.as_deref());
    let response = match fault {
        None => answer(&req, &body, &shared).await,
        Some(failed @ Fault::Status(_)) => fault::response(failed),
        Some(lost @ Fault::AnswerLost(_)) => {
            // It takes effect; its answer does not arrive.
            drop(answer(&req, &body, &shared).await);
            fault::response(lost)
        }
    };
    shared.lock().requests.push(store::RequestRecord {
        method: req.method().as_str().to_owned(),
        uri: req.uri().to_string(),
        status: response.status().as_u16(),
        faulted: fault.is_some(),
    });
    response
}

async fn answer(req: &HttpRequest, body: &[u8], shared: &Arc<Shared>) -> HttpResponse {
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // kubectl sends no bearer token over plain HTTP: a request without one is the
    // kubeconfig's user; a wrong token is refused.
    if bearer.is_some_and(|b| b != shared.token) {
        return error_response(&ApiError::other(401, "Unauthorized", "Unauthorized"));
    }
    let query: Query = web::Query::<Query>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .unwrap_or_default();
    let path = req.path();
    let method = req.method().as_str();
    match path.trim_end_matches('/') {
        "/version" => {
            return json_response(
                200,
                &json!({
                    "major": "1", "minor": "32", "gitVersion": "v1.32.0-fake-kube",
                    "gitCommit": "", "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z",
                    "goVersion": "go1.23", "compiler": "gc", "platform": "linux/amd64",
                }),
            );
        }
        "/api" => {
            return json_response(
                200,
                &json!({
                    "kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}],
                }),
            );
        }
        "/apis" => return json_response(200, &groups()),
        "/api/v1" => return json_response(200, &discovery_group("", "v1")),
        "/apis/batch/v1" => return json_response(200, &discovery_group("batch", "v1")),
        "/apis/authorization.k8s.io/v1" => {
            return json_response(200, &discovery_group("authorization.k8s.io", "v1"));
        }
        // kubectl's client-side validation: no OpenAPI v3, and an empty v2 document (an empty
        // protobuf message, or an empty JSON object) lets `kubectl create -f` go on.
        "/openapi/v2" => {
            let protobuf = req
                .headers()
                .get("accept")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|a| a.contains("protobuf"));
            return if protobuf {
                HttpResponse::Ok()
                    .content_type("application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
                    .body(Vec::<u8>::new())
            } else {
                json_response(200, &json!({}))
            };
        }
        _ => {}
    }
    let target = match parse_target(path) {
        Ok(Some(t)) => t,
        Ok(None) => {
            return error_response(&ApiError::other(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
        Err(e) => return error_response(&e),
    };
    let verb = verb(method, &target, &query);
    if let Some(rbac) = &shared.role
        && target.resource.name != "selfsubjectaccessreviews"
    {
        let attributes = Attributes {
            verb,
            group: target.resource.group,
            resource: target.resource.name,
            subresource: &target.subresource,
            namespace: &target.namespace,
            name: &target.name,
        };
        if !rbac.allows(&attributes) {
            let mut e = ApiError::other(403, "Forbidden", rbac.forbidden_message(&attributes));
            e.details = Some((
                target.name.clone(),
                target.resource.group.to_owned(),
                target.resource.name.to_owned(),
            ));
            return error_response(&e);
        }
    }
    if verb == "watch" {
        return crate::api::watch(shared.clone(), &target, &query);
    }
    if target.subresource == "log" && verb == "get" {
        return crate::kubelet::log_response(
            shared.clone(),
            &target.namespace,
            &target.name,
            &query,
        )
        .await;
    }
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let result = match verb {
        "get" => get(shared, &target),
        "list" => list(shared, &target, &query),
        "create" => create(shared, &target, &query, body, &content_type),
        "update" => update(shared, &target, &query, body, &content_type),
        "patch" => patch(shared, &target, &query, body, &content_type),
        "delete" => delete(shared, &target, &query, body),
        "deletecollection" => delete_collection(shared, &target, &query, body),
        _ => Err(ApiError::other(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )),
    };
    match result {
        Ok((code, value, warning)) => {
            let mut response = json_response(code, &value);
            if let Some(warning) = warning
                && let Ok(v) =
                    actix_web::http::header::HeaderValue::from_str(&format!("299 - \"{warning}\""))
            {
                response.headers_mut().insert(
                    actix_web::http::header::HeaderName::from_static("warning"),
                    v,
                );
            }
            response
        }
        Err(e) => error_response(&e),
    }
}

type Answer = Result<(u16, Value, Option<String>), ApiError>;

fn get(shared: &Shared, t: &Target) -> Answer {
    let store = shared.lock();
    if t.resource.name == "selfsubjectaccessreviews" {
        return Err(ApiError::other(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ));
    }
    let object = store
        .get(t.resource.name, &t.namespace, &t.name)
        .ok_or_else(|| ApiError::not_found(t.resource, &t.name))?;
    Ok((200, object.clone(), None))
}

fn selectors(query: &Query) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))
        .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

/// The target's objects (in its namespace, or all) that both selectors match.
fn selected(
    store: &Store,
    t: &Target,
    labels: &LabelSelector,
    fields: &FieldSelector,
) -> Vec<Value> {
    let ns = (!t.namespace.is_empty()).then_some(t.namespace.as_str());
    store
        .list(t.resource.name, ns)
        .into_iter()
        .filter(|o| labels.matches(o) && fields.matches(o))
        .collect()
}

/// A list of the target's kind (`PodList`, ...) at the store's current version.
fn list_json(store: &Store, t: &Target, items: Vec<Value>) -> Value {
    json!({
        "kind": format!("{}List", t.resource.kind),
        "apiVersion": store::api_version(t.resource),
        "metadata": {"resourceVersion": store.rv.to_string()},
        "items": items,
    })
}

fn list(shared: &Shared, t: &Target, query: &Query) -> Answer {
    let (labels, fields) = selectors(query)?;
    let store = shared.lock();
    let items = selected(&store, t, &labels, &fields);
    Ok((200, list_json(&store, t, items), None))
}

fn parse_body(body: &[u8], content_type: &str, kind: &str) -> Result<Value, ApiError> {
    if content_type.contains("protobuf") {
        if crate::proto::readable(kind) {
            return crate::proto::decode(body, kind).map_err(|e| {
                ApiError::bad_request(format!("the protobuf body cannot be read: {e}"))
            });
        }
        return Err(ApiError::other(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (fake-kube reads protobuf for namespaces, secrets, config maps and access reviews only, not {kind})"
            ),
        ));
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body of the request is not JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request is not a JSON object",
        ));
    }
    Ok(value)
}

fn dry_run(query: &Query) -> Result<bool, ApiError> {
    match query.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "unsupported dry run value {other:?}: only \"All\""
        ))),
    }
}

fn str_map(value: &Value) -> bool {
    value.is_null()
        || value
            .as_object()
            .is_some_and(|m| m.values().all(Value::is_string))
}

/// Validates and fills in an object's kind-specific defaults before it is stored.
pub fn validate(r: &Resource, name: &str, object: &mut Value) -> Result<(), ApiError> {
    let invalid = |problem: &str| ApiError::invalid(r, name, problem);
    let meta = &object["metadata"];
    if !str_map(&meta["labels"]) {
        return Err(invalid(
            "metadata.labels: Invalid value: labels must be strings",
        ));
    }
    if !str_map(&meta["annotations"]) {
        return Err(invalid(
            "metadata.annotations: Invalid value: annotations must be strings",
        ));
    }
    match r.name {
        "pods" => {
            validate_pod_spec(&mut object["spec"], "spec", false).map_err(|p| invalid(&p))?;
            object["spec"]["nodeName"] = json!(crate::kubelet::NODE_NAME);
            object["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
        }
        "jobs" => {
            let spec = &mut object["spec"];
            if !spec.is_object() {
                return Err(invalid("spec: Required value"));
            }
            for field in ["parallelism", "completions"] {
                match spec[field].as_i64() {
                    None if spec[field].is_null() => spec[field] = json!(1),
                    Some(1) => {}
                    _ => {
                        return Err(invalid(&format!(
                            "spec.{field}: Unsupported value: fake-kube runs jobs with {field} 1 only"
                        )));
                    }
                }
            }
            if spec["backoffLimit"].is_null() {
                spec["backoffLimit"] = json!(6);
            }
            for field in [
                "backoffLimit",
                "activeDeadlineSeconds",
                "ttlSecondsAfterFinished",
            ] {
                if !spec[field].is_null() && spec[field].as_i64().is_none_or(|n| n < 0) {
                    return Err(invalid(&format!(
                        "spec.{field}: Invalid value: must be a non-negative integer"
                    )));
                }
            }
            if spec["activeDeadlineSeconds"].as_i64() == Some(0) {
                return Err(invalid(
                    "spec.activeDeadlineSeconds: Invalid value: 0: must be greater than 0",
                ));
            }
            spec["completionMode"] = spec
                .get("completionMode")
                .cloned()
                .filter(|v| !v.is_null())
                .unwrap_or(json!("NonIndexed"));
            spec["suspend"] = spec
                .get("suspend")
                .cloned()
                .filter(|v| !v.is_null())
                .unwrap_or(json!(false));
            if spec["suspend"] == json!(true) {
                return Err(invalid(
                    "spec.suspend: Unsupported value: fake-kube does not suspend jobs",
                ));
            }
            let template = &mut spec["template"];
            if !template.is_object() {
                return Err(invalid("spec.template: Required value"));
            }
            validate_pod_spec(&mut template["spec"], "spec.template.spec", true)
                .map_err(|p| invalid(&p))?;
            object["status"] = json!({});
        }
        "secrets" => {
            let mut data = serde_json::Map::new();
            if let Some(existing) = object["data"].as_object() {
                for (k, v) in existing {
                    let text = v.as_str().unwrap_or_default();
                    if !v.is_string()
                        || base64::engine::general_purpose::STANDARD
                            .decode(text)
                            .is_err()
                    {
                        return Err(invalid(&format!("data[{k}]: Invalid value: not base64")));
                    }
                    data.insert(k.clone(), v.clone());
                }
            } else if !object["data"].is_null() {
                return Err(invalid("data: Invalid value: must be a map"));
            }
            if !str_map(&object["stringData"]) {
                return Err(invalid("stringData: Invalid value: values must be strings"));
            }
            if let Some(string_data) = object["stringData"].as_object() {
                for (k, v) in string_data {
                    let encoded = base64::engine::general_purpose::STANDARD
                        .encode(v.as_str().unwrap_or_default());
                    data.insert(k.clone(), json!(encoded));
                }
            }
            if let Some(map) = object.as_object_mut() {
                map.remove("stringData");
            }
            object["data"] = Value::Object(data);
            if object["type"].is_null() {
                object["type"] = json!("Opaque");
            }
        }
        "configmaps" if !str_map(&object["data"]) => {
            return Err(invalid("data: Invalid value: values must be strings"));
        }
        "namespaces" => {
            let labels = &mut object["metadata"]["labels"];
            if labels.is_null() {
                *labels = json!({});
            }
            labels["kubernetes.io/metadata.name"] = json!(name);
            object["spec"] = json!({"finalizers": ["kubernetes"]});
            object["status"] = json!({"phase": "Active"});
        }
        _ => {}
    }
    Ok(())
}

fn validate_pod_spec(spec: &mut Value, at: &str, job: bool) -> Result<(), String> {
    if !spec.is_object() {
        return Err(format!("{at}: Required value"));
    }
    let containers = spec["containers"].as_array().cloned().unwrap_or_default();
    if containers.is_empty() {
        return Err(format!("{at}.containers: Required value"));
    }
    for (field, list) in [
        ("containers", containers),
        (
            "initContainers",
            spec["initContainers"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        ),
    ] {
        for (i, c) in list.iter().enumerate() {
            let name = c["name"].as_str().unwrap_or_default();
            if !valid_name(name, 63) || name.contains('.') {
                return Err(format!(
                    "{at}.{field}[{i}].name: Invalid value: {name:?}: a lowercase RFC 1123 label is required"
                ));
            }
            if c["image"].as_str().is_none_or(str::is_empty) {
                return Err(format!("{at}.{field}[{i}].image: Required value"));
            }
            for part in ["command", "args"] {
                if !c[part].is_null()
                    && !c[part]
                        .as_array()
                        .is_some_and(|a| a.iter().all(Value::is_string))
                {
                    return Err(format!(
                        "{at}.{field}[{i}].{part}: Invalid value: must be a list of strings"
                    ));
                }
            }
        }
    }
    match (spec["restartPolicy"].as_str(), job) {
        (None, false) => spec["restartPolicy"] = json!("Always"),
        (Some("Always" | "OnFailure" | "Never"), false) => {}
        (Some("OnFailure" | "Never"), true) => {}
        (_, true) => {
            return Err(format!(
                "{at}.restartPolicy: Required value: valid values: \"OnFailure\", \"Never\""
            ));
        }
        (Some(other), false) => {
            return Err(format!("{at}.restartPolicy: Unsupported value: {other:?}"));
        }
    }
    if spec["terminationGracePeriodSeconds"].is_null() {
        spec["terminationGracePeriodSeconds"] = json!(30);
    } else if spec["terminationGracePeriodSeconds"]
        .as_i64()
        .is_none_or(|n| n < 0)
    {
        return Err(format!(
            "{at}.terminationGracePeriodSeconds: Invalid value: must be a non-negative integer"
        ));
    }
    if spec["dnsPolicy"].is_null() {
        spec["dnsPolicy"] = json!("ClusterFirst");
    }
    if spec["serviceAccountName"].is_null() {
        spec["serviceAccountName"] = json!("default");
    }
    Ok(())
}

/// Completes a new object's name and metadata, validates it, and stores it (unless
/// `dry_run`).
pub fn create_object(
    store: &mut Store,
    r: &'static Resource,
    ns: &str,
    mut object: Value,
    dry_run: bool,
) -> Result<Value, ApiError> {
    if !object["metadata"].is_object() {
        if object["metadata"].is_null() {
            object["metadata"] = json!({});
        } else {
            return Err(ApiError::bad_request("metadata must be an object"));
        }
    }
    if let Some(kind) = object["kind"].as_str()
        && kind != r.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind {kind:?} does not match the resource {:?} ({})",
            r.name, r.kind
        )));
    }
    if let Some(version) = object["apiVersion"].as_str()
        && version != store::api_version(r)
    {
        return Err(ApiError::bad_request(format!(
            "the API version {version:?} does not match {:?}",
            store::api_version(r)
        )));
    }
    if r.namespaced {
        match object["metadata"]["namespace"].as_str() {
            Some(n) if !n.is_empty() && n != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {}
        }
        let namespaces = store::resource("", "namespaces")
            .ok_or_else(|| ApiError::other(500, "InternalError", "no namespaces"))?;
        if store.get("namespaces", "", ns).is_none() {
            return Err(ApiError::not_found(namespaces, ns));
        }
    }
    let name = match (
        object["metadata"]["name"].as_str(),
        object["metadata"]["generateName"].as_str(),
    ) {
        (Some(name), _) if !name.is_empty() => name.to_owned(),
        (_, Some(prefix)) if !prefix.is_empty() => format!("{prefix}{}", random_suffix()),
        _ => {
            return Err(ApiError::invalid(
                r,
                "",
                "metadata.name: Required value: name or generateName is required",
            ));
        }
    };
    let max = if matches!(r.name, "jobs" | "namespaces") {
        63
    } else {
        253
    };
    if !valid_name(&name, max) {
        return Err(ApiError::invalid(
            r,
            &name,
            &format!(
                "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain of at most {max} characters is required"
            ),
        ));
    }
    object["metadata"]["name"] = json!(name);
    if let Some(map) = object["metadata"].as_object_mut() {
        for server_field in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            map.remove(server_field);
        }
    }
    validate(r, &name, &mut object)?;
    if r.name == "jobs" {
        controller::default_job(&mut object);
    }
    if store.get(r.name, ns, &name).is_some() {
        return Err(ApiError {
            code: 409,
            reason: "AlreadyExists",
            message: format!("{} \"{name}\" already exists", store::qualified(r)),
            details: Some((name.clone(), r.group.to_owned(), r.name.to_owned())),
        });
    }
    let store_ns = if r.namespaced { ns } else { "" };
    if dry_run {
        let mut preview = object;
        preview["apiVersion"] = json!(store::api_version(r));
        preview["kind"] = json!(r.kind);
        preview["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
        preview["metadata"]["creationTimestamp"] = json!(store::now_rfc3339());
        if r.namespaced {
            preview["metadata"]["namespace"] = json!(ns);
        }
        return Ok(preview);
    }
    Ok(store.insert(r, store_ns, object))
}

fn create(shared: &Shared, t: &Target, query: &Query, body: &[u8], content_type: &str) -> Answer {
    if !t.name.is_empty() {
        return Err(ApiError::other(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ));
    }
    let object = parse_body(body, content_type, t.resource.kind)?;
    if t.resource.name == "selfsubjectaccessreviews" {
        return Ok((201, access_review(shared, object)?, None));
    }
    let dry = dry_run(query)?;
    let mut store = shared.lock();
    let created = create_object(&mut store, t.resource, &t.namespace, object, dry)?;
    Ok((201, created, None))
}

fn access_review(shared: &Shared, mut review: Value) -> Result<Value, ApiError> {
    let attributes = &review["spec"]["resourceAttributes"];
    if !attributes.is_object() {
        return Err(ApiError::other(
            422,
            "Invalid",
            "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.resourceAttributes: Required value (fake-kube answers resource attributes only)",
        ));
    }
    let text = |field: &str| attributes[field].as_str().unwrap_or_default().to_owned();
    let (verb, group, resource, sub, ns, name) = (
        text("verb"),
        text("group"),
        text("resource"),
        text("subresource"),
        text("namespace"),
        text("name"),
    );
    let a = Attributes {
        verb: &verb,
        group: &group,
        resource: &resource,
        subresource: &sub,
        namespace: &ns,
        name: &name,
    };
    let (allowed, reason) = match &shared.role {
        None => (
            true,
            "fake-kube runs without a Role: everything is allowed".to_owned(),
        ),
        Some(rbac) if rbac.allows(&a) => (
            true,
            format!(
                "RBAC: allowed by the Role in namespace {:?}",
                rbac.namespace
            ),
        ),
        Some(_) => (false, String::new()),
    };
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!("SelfSubjectAccessReview");
    if review["metadata"].is_null() {
        review["metadata"] = json!({});
    }
    review["metadata"]["creationTimestamp"] = Value::Null;
    review["status"] = json!({"allowed": allowed});
    if !reason.is_empty() {
        review["status"]["reason"] = json!(reason);
    }
    Ok(review)
}

/// A JSON merge patch (RFC 7386).
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            for (k, v) in fields {
                if v.is_null() {
                    if let Some(map) = target.as_object_mut() {
                        map.remove(k);
                    }
                } else {
                    merge_patch(&mut target[k.as_str()], v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Keeps what a write through the main resource (or the status subresource) cannot change.
fn keep_protected(old: &Value, new: &mut Value, status_only: bool) {
    if status_only {
        let status = new["status"].clone();
        *new = old.clone();
        new["status"] = status;
        return;
    }
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "namespace",
        "name",
    ] {
        match old["metadata"].get(field) {
            Some(v) => new["metadata"][field] = v.clone(),
            None => {
                if let Some(map) = new["metadata"].as_object_mut() {
                    map.remove(field);
                }
            }
        }
    }
    new["apiVersion"] = old["apiVersion"].clone();
    new["kind"] = old["kind"].clone();
    if old.get("status").is_some() {
        new["status"] = old["status"].clone();
    }
}

fn write_back(store: &mut Store, t: &Target, old: &Value, mut new: Value, dry: bool) -> Answer {
    keep_protected(old, &mut new, t.subresource == "status");
    if t.subresource.is_empty() {
        let mut check = new.clone();
        validate(t.resource, &t.name, &mut check)?;
        if t.resource.name == "jobs" && old["spec"] != new["spec"] {
            let (old_spec, new_spec) = (&old["spec"], &new["spec"]);
            let mutable = [
                "activeDeadlineSeconds",
                "ttlSecondsAfterFinished",
                "backoffLimit",
                "suspend",
            ];
            let changed_immutable = new_spec
                .as_object()
                .into_iter()
                .flatten()
                .any(|(k, v)| !mutable.contains(&k.as_str()) && old_spec.get(k) != Some(v));
            if changed_immutable {
                return Err(ApiError::invalid(
                    t.resource,
                    &t.name,
                    "spec.template: Invalid value: field is immutable",
                ));
            }
        }
        if t.resource.name == "pods" && old["spec"] != new["spec"] {
            return Err(ApiError::invalid(
                t.resource,
                &t.name,
                "spec: Forbidden: pod updates may not change fields other than image, activeDeadlineSeconds, tolerations (fake-kube: none)",
            ));
        }
    }
    if dry {
        return Ok((200, new, None));
    }
    let updated = store.update(t.resource, &t.namespace, new);
    Ok((200, updated, None))
}

fn patch(shared: &Shared, t: &Target, query: &Query, body: &[u8], content_type: &str) -> Answer {
    let kind = content_type.split(';').next().unwrap_or_default().trim();
    if !matches!(
        kind,
        "application/merge-patch+json" | "application/strategic-merge-patch+json"
    ) {
        return Err(ApiError::other(
            415,
            "UnsupportedMediaType",
            format!(
                "fake-kube applies merge patches only (application/merge-patch+json, application/strategic-merge-patch+json treated as a merge patch), not {kind}"
            ),
        ));
    }
    let dry = dry_run(query)?;
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the patch is not JSON: {e}")))?;
    if !patch.is_object() {
        return Err(ApiError::bad_request("the patch is not a JSON object"));
    }
    let mut store = shared.lock();
    let old = store
        .get(t.resource.name, &t.namespace, &t.name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(t.resource, &t.name))?;
    let mut new = old.clone();
    merge_patch(&mut new, &patch);
    write_back(&mut store, t, &old, new, dry)
}

fn update(shared: &Shared, t: &Target, query: &Query, body: &[u8], content_type: &str) -> Answer {
    let dry = dry_run(query)?;
    let new = parse_body(body, content_type, t.resource.kind)?;
    let mut store = shared.lock();
    let old = store
        .get(t.resource.name, &t.namespace, &t.name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(t.resource, &t.name))?;
    if let Some(rv) = new["metadata"]["resourceVersion"].as_str()
        && Some(rv) != old["metadata"]["resourceVersion"].as_str()
    {
        return Err(ApiError {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                store::qualified(t.resource),
                t.name
            ),
            details: Some((
                t.name.clone(),
                t.resource.group.to_owned(),
                t.resource.name.to_owned(),
            )),
        });
    }
    write_back(&mut store, t, &old, new, dry)
}

/// The delete options of a request: from the body (`DeleteOptions`) or the query.
fn delete_options(
    query: &Query,
    body: &[u8],
) -> Result<(Option<String>, Option<i64>, bool), ApiError> {
    let options: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the DeleteOptions are not JSON: {e}")))?
    };
    let policy = options["propagationPolicy"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| query.get("propagationPolicy").cloned());
    if let Some(p) = &policy
        && !matches!(p.as_str(), "Foreground" | "Background" | "Orphan")
    {
        return Err(ApiError::bad_request(format!(
            "propagationPolicy {p:?} is not one of Foreground, Background, Orphan"
        )));
    }
    let grace = match options["gracePeriodSeconds"].as_i64() {
        Some(g) => Some(g),
        None => match query.get("gracePeriodSeconds") {
            Some(g) => Some(g.parse::<i64>().map_err(|_| {
                ApiError::bad_request(format!("gracePeriodSeconds {g:?} is not a number"))
            })?),
            None => None,
        },
    };
    if grace.is_some_and(|g| g < 0) {
        return Err(ApiError::bad_request(
            "gracePeriodSeconds must not be negative",
        ));
    }
    let dry = options["dryRun"]
        .as_array()
        .is_some_and(|d| d.iter().any(|v| v == "All"))
        || dry_run(query)?;
    Ok((policy, grace, dry))
}

fn delete(shared: &Shared, t: &Target, query: &Query, body: &[u8]) -> Answer {
    if !t.subresource.is_empty() {
        return Err(ApiError::other(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ));
    }
    let (policy, grace, dry) = delete_options(query, body)?;
    let mut store = shared.lock();
    if dry {
        let object = store
            .get(t.resource.name, &t.namespace, &t.name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(t.resource, &t.name))?;
        return Ok((200, object, None));
    }
    controller::delete(
        &mut store,
        t.resource,
        &t.namespace,
        &t.name,
        policy.as_deref(),
        grace,
    )
}

fn delete_collection(shared: &Shared, t: &Target, query: &Query, body: &[u8]) -> Answer {
    let (labels, fields) = selectors(query)?;
    let (policy, grace, dry) = delete_options(query, body)?;
    let mut store = shared.lock();
    let items = selected(&store, t, &labels, &fields);
    if !dry {
        for item in &items {
            let name = item["metadata"]["name"].as_str().unwrap_or_default();
            let ns = item["metadata"]["namespace"].as_str().unwrap_or_default();
            controller::delete(&mut store, t.resource, ns, name, policy.as_deref(), grace)?;
        }
    }
    Ok((200, list_json(&store, t, items), None))
}

/// A watch: the events after the asked version (or the current objects as `ADDED` first),
/// one JSON object a line, until `timeoutSeconds` or the client goes.
fn watch(shared: Arc<Shared>, t: &Target, query: &Query) -> HttpResponse {
    let (labels, fields) = match selectors(query) {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let resource = t.resource;
    let namespace = t.namespace.clone();
    let name = t.name.clone();
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true" || v == "1");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(1800);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    let asked = query.get("resourceVersion").cloned().unwrap_or_default();
    let matches = move |o: &Value| {
        (namespace.is_empty() || o["metadata"]["namespace"].as_str() == Some(namespace.as_str()))
            && (name.is_empty() || o["metadata"]["name"].as_str() == Some(name.as_str()))
            && labels.matches(o)
            && fields.matches(o)
    };
    let mut first = Vec::new();
    let from;
    let mut receiver;
    {
        let store = shared.lock();
        receiver = store.changed.subscribe();
        if asked.is_empty() || asked == "0" {
            for o in store.list(resource.name, None) {
                if matches(&o) {
                    first.push(json!({"type": "ADDED", "object": o}));
                }
            }
            from = store.rv;
        } else {
            match asked.parse::<u64>() {
                Ok(rv) if rv < store.expired_upto => {
                    let status = ApiError::other(
                        410,
                        "Expired",
                        format!(
                            "too old resource version: {rv} ({})",
                            store.expired_upto + 1
                        ),
                    )
                    .status();
                    first.push(json!({"type": "ERROR", "object": status}));
                    from = u64::MAX;
                }
                Ok(rv) => from = rv,
                Err(_) => {
                    return error_response(&ApiError::bad_request(format!(
                        "resourceVersion {asked:?} is not a version of this server"
                    )));
                }
            }
        }
    }
    let kind = resource.kind;
    let version = store::api_version(resource);
    struct WatchState<F> {
        shared: Arc<Shared>,
        pending: std::collections::VecDeque<Value>,
        from: u64,
        matches: F,
        last_bookmark: tokio::time::Instant,
    }
    let state = WatchState {
        shared,
        pending: first.into(),
        from,
        matches,
        last_bookmark: tokio::time::Instant::now(),
    };
    let stream = futures_util::stream::unfold(
        (state, receiver_take(&mut receiver)),
        move |(mut state, mut receiver)| {
            let version = version.clone();
            async move {
                loop {
                    if let Some(event) = state.pending.pop_front() {
                        let mut line = event.to_string();
                        line.push('\n');
                        return Some((
                            Ok::<_, std::convert::Infallible>(Bytes::from(line)),
                            (state, receiver),
                        ));
                    }
                    if state.from == u64::MAX || tokio::time::Instant::now() >= deadline {
                        return None;
                    }
                    {
                        let store = state.shared.lock();
                        if state.from < store.expired_upto {
                            let status =
                                ApiError::other(410, "Expired", "too old resource version")
                                    .status();
                            state
                                .pending
                                .push_back(json!({"type": "ERROR", "object": status}));
                            state.from = u64::MAX;
                            continue;
                        }
                        for e in store.events.iter().filter(|e| e.rv > state.from) {
                            if e.resource == resource.name && (state.matches)(&e.object) {
                                state
                                    .pending
                                    .push_back(json!({"type": e.kind, "object": e.object}));
                            }
                        }
                        state.from = store.rv;
                    }
                    if !state.pending.is_empty() {
                        continue;
                    }
                    if bookmarks && state.last_bookmark.elapsed() > Duration::from_secs(5) {
                        state.last_bookmark = tokio::time::Instant::now();
                        let bookmark = json!({"type": "BOOKMARK", "object": {
                            "kind": kind, "apiVersion": version,
                            "metadata": {"resourceVersion": state.from.to_string()},
                        }});
                        state.pending.push_back(bookmark);
                        continue;
                    }
                    let wait = deadline.min(tokio::time::Instant::now() + Duration::from_secs(5));
                    let _ = tokio::time::timeout_at(wait, receiver.changed()).await;
                }
            }
        },
    );
    HttpResponse::Ok()
        .content_type("application/json")
        .streaming(stream)
}

fn receiver_take(
    receiver: &mut tokio::sync::watch::Receiver<u64>,
) -> tokio::sync::watch::Receiver<u64> {
    receiver.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut target = json!({"a": 1, "b": {"c": 2, "d": 3}});
        merge_patch(&mut target, &json!({"a": null, "b": {"c": 4}, "e": [1]}));
        assert_eq!(target, json!({"b": {"c": 4, "d": 3}, "e": [1]}));
    }

    #[test]
    fn paths_name_their_objects() {
        let t = parse_target("/apis/batch/v1/namespaces/ns/jobs/j")
            .expect("ok")
            .expect("some");
        assert_eq!(
            (t.resource.name, t.namespace.as_str(), t.name.as_str()),
            ("jobs", "ns", "j")
        );
        let t = parse_target("/api/v1/namespaces/ns/pods/p/log")
            .expect("ok")
            .expect("some");
        assert_eq!(t.subresource, "log");
        let t = parse_target("/api/v1/namespaces/x")
            .expect("ok")
            .expect("some");
        assert_eq!((t.resource.name, t.name.as_str()), ("namespaces", "x"));
        assert!(parse_target("/api/v1/namespaces/ns/widgets").is_err());
        assert!(parse_target("/api/v1/namespaces/ns/pods/p/exec").is_err());
    }
}
