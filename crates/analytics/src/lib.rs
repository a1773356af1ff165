//! agentry's cost analytics (SPEC §4): the report as pure functions over plain task data.
//! Built by the cost-analytics capability; this crate has no code yet, and nothing in the
//! workspace depends on it.
