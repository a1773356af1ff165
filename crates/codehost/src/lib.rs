//! agentry's code-host integration: the one GitHub REST client (rate limits, retries,
//! conditional requests), webhook signature checks and event parsing, and a fake GitHub for
//! tests. Built by the code-host capability; this crate has no code yet, and nothing in the
//! workspace depends on it.
