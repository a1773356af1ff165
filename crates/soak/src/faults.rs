//! The faults the fake code host injects, and how the recorded answers are counted by kind.
//!
//! Each kind answers with a status no healthy answer of the soak uses, so the fake's request
//! records tell the kinds apart: 500 and 503 (plain server errors), 504 (a timeout: the
//! answer is held, then a gateway timeout), 403 (the primary rate limit with `Retry-After`)
//! and 502 (the answer lost after the request took effect).

use std::collections::BTreeMap;
use std::time::Duration;

use agentry_fake_github::{FakeGitHub, Fault, RequestRecord};

/// The kinds, their share of the faults, and the status each is recorded with.
fn kinds() -> Vec<(&'static str, f64, Fault)> {
    vec![
        (
            "answer lost after the effect (502)",
            0.30,
            Fault::AnswerLost(502),
        ),
        ("server error (500)", 0.20, Fault::Status(500)),
        ("unavailable (503)", 0.10, Fault::Status(503)),
        (
            "timeout (held 3 s, then 504)",
            0.15,
            Fault::Timeout(Duration::from_secs(3)),
        ),
        (
            "rate limited (403, Retry-After: 1)",
            0.15,
            Fault::RateLimited {
                retry_after_secs: 1,
            },
        ),
        (
            "rate limited (403, Retry-After: 2)",
            0.10,
            Fault::RateLimited {
                retry_after_secs: 2,
            },
        ),
    ]
}

/// Makes `rate` of every request fail, spread over the kinds by their shares. The fake
/// tries its rules in order, each with its own draw, so each rule's probability is its
/// share of what the rules before it let through.
pub fn inject(fake: &FakeGitHub, rate: f64, seed: u64) {
    if rate <= 0.0 {
        return;
    }
    let mut passed = 1.0;
    for (i, (_, share, fault)) in kinds().into_iter().enumerate() {
        let p = (rate * share / passed).clamp(0.0, 1.0);
        fake.fail_fraction(None, p, fault, seed.wrapping_add(i as u64 * 7919));
        passed -= rate * share;
    }
}

/// The recorded answers by fault kind (statuses only these faults produce in the soak).
pub fn count(requests: &[RequestRecord]) -> BTreeMap<&'static str, usize> {
    let mut out = BTreeMap::new();
    for r in requests {
        let kind = match r.status {
            502 => "answer lost after the effect (502)",
            500 => "server error (500)",
            503 => "unavailable (503)",
            504 => "timeout (held 3 s, then 504)",
            403 => "rate limited (403, Retry-After)",
            _ => continue,
        };
        *out.entry(kind).or_insert(0) += 1;
    }
    out
}
