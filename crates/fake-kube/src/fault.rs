//! Faults a test injects ([`crate::FakeKube::fail_next`]): the next requests of a method on a
//! resource fail as they do when an API server is overloaded or restarting, or answers too
//! late for a request it applied. The same shape as fake-github's.

use actix_web::HttpResponse;

use crate::store::ApiError;

/// A failure the fake answers instead of handling a request, or instead of its answer (see
/// [`crate::FakeKube::fail_next`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer this status (anything outside 400–599 becomes 500) with the `Status` of its
    /// reason (500 `InternalError`, 503 `ServiceUnavailable`, 429 `TooManyRequests`, …),
    /// without handling the request.
    Status(u16),
    /// Handle the request (it takes effect), then answer this status instead of its answer:
    /// 504 `Timeout` is an API server whose storage answered too late. The "did it happen?"
    /// case.
    AnswerLost(u16),
}

/// The next `left` requests of `route` (method, resource; `None`: any request) get `fault`.
#[derive(Debug)]
struct Rule {
    route: Option<(String, String)>,
    left: usize,
    fault: Fault,
}

/// The faults still to happen, in the order they were added.
#[derive(Debug, Default)]
pub(crate) struct Faults(Vec<Rule>);

impl Faults {
    /// Adds a rule after the others: the next `n` requests of `route` get `fault`.
    pub fn add(&mut self, route: Option<(&str, &str)>, n: usize, fault: Fault) {
        if n > 0 {
            self.0.push(Rule {
                route: route.map(|(m, r)| (m.to_owned(), r.to_owned())),
                left: n,
                fault,
            });
        }
    }

    /// The fault a request of `method` on `resource` (`None`: no resource, as discovery)
    /// gets, if a rule matches it: the first that does, which has one request fewer to go.
    pub fn take(&mut self, method: &str, resource: Option<&str>) -> Option<Fault> {
        let at = self.0.iter().position(|rule| match &rule.route {
            None => true,
            Some((m, r)) => m.eq_ignore_ascii_case(method) && Some(r.as_str()) == resource,
        })?;
        let rule = &mut self.0[at];
        let fault = rule.fault;
        rule.left -= 1;
        if rule.left == 0 {
            self.0.remove(at);
        }
        Some(fault)
    }
}

/// The answer of a request `fault` failed.
pub(crate) fn response(fault: Fault) -> HttpResponse {
    let (Fault::Status(code) | Fault::AnswerLost(code)) = fault;
    let code = if (400..=599).contains(&code) {
        code
    } else {
        500
    };
    let (reason, message) = match code {
        403 => ("Forbidden", "forbidden: injected fault"),
        409 => ("Conflict", "Operation cannot be fulfilled: injected fault"),
        429 => (
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later",
        ),
        400..=499 => ("BadRequest", "injected fault"),
        503 => (
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        ),
        504 => (
            "Timeout",
            "Timeout: request did not complete within requested timeout - context deadline \
             exceeded",
        ),
        _ => ("InternalError", "Internal error occurred: injected fault"),
    };
    crate::api::json_response(code, &ApiError::other(code, reason, message).status())
}
