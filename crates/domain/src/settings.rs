//! Per-repository settings.
//!
//! [`RepoSettings`] holds the knobs a user can set for a repository: which
//! models and agent to use, turn limits, automatic review, a cost cap per task, a
//! monthly budget, the hosts its sandboxed agents may reach (`egressAllow`), revisions, and
//! whether the model provider may reach out on an agent's behalf (`allowProviderTools`).
//! Updates arrive as JSON merge-patch style objects and are applied with
//! [`RepoSettings::apply_patch`], which validates every member and names the
//! offending one in its [`FieldError`].
//!
//! Stored settings can be loaded with validation the same way:
//! `RepoSettings::default().apply_patch(&stored_json)`.

use serde::Serialize;
use serde_json::Value;

use crate::egress::EgressPattern;
use crate::error::FieldError;
use crate::money::Usd;
use crate::task::AgentType;

/// The smallest allowed turn limit.
const MIN_TURNS: i64 = 1;
/// The largest allowed turn limit.
const MAX_TURNS: i64 = 1000;
/// The longest allowed model name, in characters.
const MAX_MODEL_CHARS: usize = 100;
/// The most patterns `egressAllow` may hold.
pub const MAX_EGRESS_ALLOW: usize = 100;

/// The JSON member names, in declaration order.
const MEMBERS: [&str; 12] = [
    CODING_MODEL,
    REVIEW_MODEL,
    MAX_TURNS_CODING,
    MAX_TURNS_REVIEW,
    AGENT_TYPE,
    AUTO_REVIEW,
    MAX_COST_PER_TASK_USD,
    MONTHLY_BUDGET_USD,
    EGRESS_ALLOW,
    MAX_REVISIONS,
    REVISE_ON_AGENT_REVIEW,
    ALLOW_PROVIDER_TOOLS,
];
const CODING_MODEL: &str = "codingModel";
const REVIEW_MODEL: &str = "reviewModel";
const MAX_TURNS_CODING: &str = "maxTurnsCoding";
const MAX_TURNS_REVIEW: &str = "maxTurnsReview";
const AGENT_TYPE: &str = "agentType";
const AUTO_REVIEW: &str = "autoReview";
const MAX_COST_PER_TASK_USD: &str = "maxCostPerTaskUsd";
const MONTHLY_BUDGET_USD: &str = "monthlyBudgetUsd";
const EGRESS_ALLOW: &str = "egressAllow";
const MAX_REVISIONS: &str = "maxRevisions";
const REVISE_ON_AGENT_REVIEW: &str = "reviseOnAgentReview";
const ALLOW_PROVIDER_TOOLS: &str = "allowProviderTools";
/// The most revision rounds [`RepoSettings::max_revisions`] allows.
pub const MAX_MAX_REVISIONS: i32 = 50;
const REVISIONS_RULE: &str = "must be an integer from 0 (no revisions) to 50";

const MODEL_RULE: &str = "must be 1 to 100 characters of A-Z, a-z, 0-9 and . _ : / -, not starting \
     with -";
const TURNS_RULE: &str = "must be an integer from 1 to 1000";
const NULLABLE_TURNS_RULE: &str = "must be an integer from 1 to 1000, or null";
const AGENT_RULE: &str = "must be one of: claude-code, codex";
const BOOL_RULE: &str = "must be true or false";
const COST_RULE: &str = "must be a decimal string greater than 0, such as \"5.00\", or null";
const BUDGET_RULE: &str =
    "must be a decimal string of at least 0, such as \"500.00\", with at most 9 decimals, or null";
const EGRESS_RULE: &str = "must be an array of at most 100 host names, IP addresses or \
     wildcards, each with an optional :port (443 when none), such as [\"pypi.org\", \
     \"*.githubusercontent.com\", \"example.com:8080\"]";
const EGRESS_MEMBER_RULE: &str = "must be a host name, an IP address or a wildcard such as \
     \"*.example.com\", with an optional :port (443 when none)";

/// Settings of one repository.
///
/// Serialised with camelCase member names; `maxTurnsCoding` is an integer
/// or `null`, `maxCostPerTaskUsd` a decimal string or `null`, `egressAllow` an array of
/// pattern strings in normal form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RepoSettings {
    /// The model for coding tasks (1 to 100 of `A-Za-z0-9._:/-`, no leading `-`).
    /// Default: the agent's ([`AgentType::default_coding_model`], `"sonnet"`).
    pub coding_model: String,
    /// The model for review tasks (1 to 100 of `A-Za-z0-9._:/-`, no leading `-`).
    /// Default: the agent's ([`AgentType::default_review_model`], `"haiku"`).
    pub review_model: String,
    /// The agent's turn limit for coding tasks, 1–1000, or `None` for no
    /// limit. Default 100.
    pub max_turns_coding: Option<i32>,
    /// The agent's turn limit for review tasks, 1–1000. Default 30.
    pub max_turns_review: i32,
    /// The agent that runs tasks. Default Claude Code.
    pub agent_type: AgentType,
    /// Whether a review task is created automatically for each pull request
    /// a coding task opens. Default `true`.
    pub auto_review: bool,
    /// The most a single task may cost, greater than zero, or `None` for no
    /// cap. Default `None`.
    pub max_cost_per_task_usd: Option<Usd>,
    /// What agent runs on this repository may spend in a UTC calendar month, or `None` for
    /// no budget (docs/contract.md#67-budgets). Default `None`.
    pub monthly_budget_usd: Option<Usd>,
    /// The hosts the repository's sandboxed agents may reach through the egress proxy,
    /// besides the instance's (`AGENTRY_EGRESS_ALLOW`): at most [`MAX_EGRESS_ALLOW`]
    /// patterns (`host`, `host:port`; without a port, 443 only), in normal form, each once.
    /// Default: none.
    pub egress_allow: Vec<EgressPattern>,
    /// How many revision rounds review feedback may start on one pull request, 0–50; 0
    /// turns revisions off (docs/contract.md#57-revisions). Default 3.
    pub max_revisions: i32,
    /// Whether the findings of agentry's own review agent start a revision round like a
    /// reviewer's "changes requested". Default `false`.
    pub revise_on_agent_review: bool,
    /// Whether the model gateway passes on model calls that ask the provider to reach out
    /// on the agent's behalf: Anthropic `mcp_servers`, server-side tools (web fetch, web
    /// search, code execution, MCP toolsets) and their `anthropic-beta` values; OpenAI
    /// `web_search`, `web_search_preview`, `file_search`, `mcp`, `code_interpreter` and
    /// `image_generation` tools. Such a call reaches hosts from the provider's servers, past
    /// the egress proxy and `egressAllow`, so it is refused unless this is on
    /// (docs/security.md). Default `false`.
    pub allow_provider_tools: bool,
}

impl Default for RepoSettings {
    fn default() -> Self {
        let agent = AgentType::default();
        Self {
            coding_model: agent.default_coding_model().to_owned(),
            review_model: agent.default_review_model().to_owned(),
            max_turns_coding: Some(100),
            max_turns_review: 30,
            agent_type: AgentType::ClaudeCode,
            auto_review: true,
            max_cost_per_task_usd: None,
            monthly_budget_usd: None,
            egress_allow: Vec::new(),
            max_revisions: 3,
            revise_on_agent_review: false,
            allow_provider_tools: false,
        }
    }
}

impl RepoSettings {
    /// Checks every field against its bounds, naming the first offending
    /// field (by its JSON member name) in the error.
    pub fn validate(&self) -> Result<(), FieldError> {
        check_model(CODING_MODEL, &self.coding_model)?;
        check_model(REVIEW_MODEL, &self.review_model)?;
        if let Some(turns) = self.max_turns_coding {
            check_turns(MAX_TURNS_CODING, i64::from(turns), NULLABLE_TURNS_RULE)?;
        }
        check_turns(
            MAX_TURNS_REVIEW,
            i64::from(self.max_turns_review),
            TURNS_RULE,
        )?;
        if let Some(cost) = self.max_cost_per_task_usd {
            check_cost(cost)?;
        }
        if self.egress_allow.len() > MAX_EGRESS_ALLOW {
            return Err(FieldError::new(EGRESS_ALLOW, EGRESS_RULE));
        }
        if !(0..=MAX_MAX_REVISIONS).contains(&self.max_revisions) {
            return Err(FieldError::new(MAX_REVISIONS, REVISIONS_RULE));
        }
        Ok(())
    }

    /// Applies a PATCH body and returns the resulting settings, leaving
    /// `self` unchanged.
    ///
    /// `patch` must be a JSON object (else the error names the field
    /// `"body"`) whose members are any subset of the camelCase member names
    /// of [`RepoSettings`]. Each member is checked strictly: integers must be
    /// JSON integers (not `5.0` or `"5"`), `null` is accepted only for
    /// `maxTurnsCoding` and `maxCostPerTaskUsd` (clearing them), and
    /// `maxCostPerTaskUsd` must be a decimal string accepted by
    /// [`Usd::parse`]. `egressAllow` replaces the whole list: an array of at most
    /// [`MAX_EGRESS_ALLOW`] strings, each an [`EgressPattern`], stored in normal form and
    /// without repetitions (`[]` clears it); a bad element is named with its index, e.g.
    /// `egressAllow[2]`. The patch is all-or-nothing: an unknown member or any
    /// bad value gives an error naming that member, and nothing is applied.
    ///
    /// A patch that changes `agentType` and names no `codingModel` (or `reviewModel`) sets
    /// that model to the new agent's default: a Claude model means nothing to Codex and the
    /// other way round.
    pub fn apply_patch(&self, patch: &Value) -> Result<RepoSettings, FieldError> {
        let members = patch
            .as_object()
            .ok_or_else(|| FieldError::new("body", "must be a JSON object of settings"))?;
        let mut next = self.clone();
        for (member, value) in members {
            match member.as_str() {
                CODING_MODEL => next.coding_model = model_value(CODING_MODEL, value)?,
                REVIEW_MODEL => next.review_model = model_value(REVIEW_MODEL, value)?,
                MAX_TURNS_CODING => {
                    next.max_turns_coding = nullable(value, |v| {
                        turns_value(MAX_TURNS_CODING, v, NULLABLE_TURNS_RULE)
                    })?;
                }
                MAX_TURNS_REVIEW => {
                    next.max_turns_review = turns_value(MAX_TURNS_REVIEW, value, TURNS_RULE)?;
                }
                AGENT_TYPE => {
                    next.agent_type = value
                        .as_str()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| FieldError::new(AGENT_TYPE, AGENT_RULE))?;
                }
                AUTO_REVIEW => next.auto_review = bool_value(AUTO_REVIEW, value)?,
                MAX_COST_PER_TASK_USD => next.max_cost_per_task_usd = nullable(value, cost_value)?,
                MONTHLY_BUDGET_USD => next.monthly_budget_usd = nullable(value, budget_value)?,
                EGRESS_ALLOW => next.egress_allow = egress_value(value)?,
                MAX_REVISIONS => {
                    next.max_revisions = value
                        .as_i64()
                        .filter(|n| (0..=i64::from(MAX_MAX_REVISIONS)).contains(n))
                        .and_then(|n| i32::try_from(n).ok())
                        .ok_or_else(|| FieldError::new(MAX_REVISIONS, REVISIONS_RULE))?;
                }
                REVISE_ON_AGENT_REVIEW => {
                    next.revise_on_agent_review = bool_value(REVISE_ON_AGENT_REVIEW, value)?;
                }
                ALLOW_PROVIDER_TOOLS => {
                    next.allow_provider_tools = bool_value(ALLOW_PROVIDER_TOOLS, value)?;
                }
                unknown => {
                    return Err(FieldError::new(
                        unknown,
                        format!("unknown setting; expected one of: {}", MEMBERS.join(", ")),
                    ));
                }
            }
        }
        if next.agent_type != self.agent_type {
            if !members.contains_key(CODING_MODEL) {
                next.coding_model = next.agent_type.default_coding_model().to_owned();
            }
            if !members.contains_key(REVIEW_MODEL) {
                next.review_model = next.agent_type.default_review_model().to_owned();
            }
        }
        Ok(next)
    }

    /// The model a `task_type` task of `agent` runs with on this repository: the
    /// repository's model when `agent` is its agent, else that agent's default (a task
    /// created with another `agentType` than the repository's).
    pub fn model_for(&self, agent: AgentType, review: bool) -> &str {
        match (agent == self.agent_type, review) {
            (true, false) => &self.coding_model,
            (true, true) => &self.review_model,
            (false, false) => agent.default_coding_model(),
            (false, true) => agent.default_review_model(),
        }
    }
}

/// Checks a model name. It becomes a command-line argument of the agent, so only a
/// conservative character set is allowed, and never a leading `-` (an option).
fn check_model(field: &str, model: &str) -> Result<(), FieldError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-');
    if model.is_empty()
        || model.len() > MAX_MODEL_CHARS
        || model.starts_with('-')
        || !model.chars().all(allowed)
    {
        return Err(FieldError::new(field, MODEL_RULE));
    }
    Ok(())
}

/// Checks a turn limit.
fn check_turns(field: &str, turns: i64, rule: &str) -> Result<(), FieldError> {
    if !(MIN_TURNS..=MAX_TURNS).contains(&turns) {
        return Err(FieldError::new(field, rule));
    }
    Ok(())
}

/// Checks a cost cap.
fn check_cost(cost: Usd) -> Result<(), FieldError> {
    if cost == Usd::ZERO {
        return Err(FieldError::new(MAX_COST_PER_TASK_USD, COST_RULE));
    }
    Ok(())
}

/// Reads a model name from a patch member.
fn model_value(field: &str, value: &Value) -> Result<String, FieldError> {
    let model = value
        .as_str()
        .ok_or_else(|| FieldError::new(field, MODEL_RULE))?;
    check_model(field, model)?;
    Ok(model.to_owned())
}

/// Reads a patch member that `null` clears: `None` for `null`, else what `read` makes of
/// the value.
fn nullable<T>(
    value: &Value,
    read: impl FnOnce(&Value) -> Result<T, FieldError>,
) -> Result<Option<T>, FieldError> {
    match value {
        Value::Null => Ok(None),
        _ => read(value).map(Some),
    }
}

/// Reads a JSON boolean from a patch member.
fn bool_value(field: &str, value: &Value) -> Result<bool, FieldError> {
    value
        .as_bool()
        .ok_or_else(|| FieldError::new(field, BOOL_RULE))
}

/// Reads a (non-null) turn limit from a patch member.
fn turns_value(field: &str, value: &Value, rule: &str) -> Result<i32, FieldError> {
    // `as_i64` is `None` for floats such as 5.0 and for integers beyond i64.
    let turns = value.as_i64().ok_or_else(|| FieldError::new(field, rule))?;
    check_turns(field, turns, rule)?;
    i32::try_from(turns).map_err(|_| FieldError::new(field, rule))
}

/// Reads a (non-null) cost cap from a patch member.
fn cost_value(value: &Value) -> Result<Usd, FieldError> {
    let cost = money_value(MAX_COST_PER_TASK_USD, COST_RULE, value)?;
    check_cost(cost)?;
    Ok(cost)
}

/// An egress allow-list from a JSON value: an array of at most [`MAX_EGRESS_ALLOW`]
/// pattern strings, normalised, each kept once (the first).
fn egress_value(value: &Value) -> Result<Vec<EgressPattern>, FieldError> {
    let items = value
        .as_array()
        .filter(|items| items.len() <= MAX_EGRESS_ALLOW)
        .ok_or_else(|| FieldError::new(EGRESS_ALLOW, EGRESS_RULE))?;
    let mut patterns: Vec<EgressPattern> = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let field = || format!("{EGRESS_ALLOW}[{index}]");
        let text = item
            .as_str()
            .ok_or_else(|| FieldError::new(field(), EGRESS_MEMBER_RULE))?;
        let pattern =
            EgressPattern::parse(text).map_err(|e| FieldError::new(field(), e.to_string()))?;
        if !patterns.contains(&pattern) {
            patterns.push(pattern);
        }
    }
    Ok(patterns)
}

/// A monthly budget from a JSON value: a decimal string of at least 0.
pub fn budget_value(value: &Value) -> Result<Usd, FieldError> {
    money_value(MONTHLY_BUDGET_USD, BUDGET_RULE, value)
}

/// An amount from a JSON string accepted by [`Usd::parse`], with errors naming `field`.
fn money_value(field: &str, rule: &str, value: &Value) -> Result<Usd, FieldError> {
    let text = value.as_str().ok_or_else(|| FieldError::new(field, rule))?;
    Usd::parse(text).map_err(|e| {
        use crate::money::MoneyError;
        match e {
            MoneyError::Invalid(_) => FieldError::new(field, rule),
            MoneyError::Negative | MoneyError::TooPrecise | MoneyError::TooLarge => {
                FieldError::new(field, e.to_string())
            }
        }
    })
}

#[cfg(test)]
mod tests {

    use super::*;
    use serde_json::json;

    fn patch(value: Value) -> Result<RepoSettings, FieldError> {
        RepoSettings::default().apply_patch(&value)
    }

    /// Asserts that patching `member` with `value` fails naming `member`.
    fn refused(member: &str, value: Value) -> FieldError {
        let err = patch(json!({ member: value.clone() })).unwrap_err();
        assert_eq!(err.field, member, "{member} = {value}");
        err
    }

    #[test]
    fn defaults() {
        let d = RepoSettings::default();
        assert_eq!(d.coding_model, "sonnet");
        assert_eq!(d.review_model, "haiku");
        assert_eq!(d.max_turns_coding, Some(100));
        assert_eq!(d.max_turns_review, 30);
        assert_eq!(d.agent_type, AgentType::ClaudeCode);
        assert!(d.auto_review);
        assert_eq!(d.max_cost_per_task_usd, None);
        assert_eq!(d.validate(), Ok(()));
    }

    #[test]
    fn serialization_shape() {
        assert_eq!(
            serde_json::to_string(&RepoSettings::default()).unwrap(),
            r#"{"codingModel":"sonnet","reviewModel":"haiku","maxTurnsCoding":100,"maxTurnsReview":30,"agentType":"claude-code","autoReview":true,"maxCostPerTaskUsd":null,"monthlyBudgetUsd":null,"egressAllow":[],"maxRevisions":3,"reviseOnAgentReview":false,"allowProviderTools":false}"#
        );
        let s = patch(json!({"maxTurnsCoding": null, "maxCostPerTaskUsd": "2.50"})).unwrap();
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["maxTurnsCoding"], Value::Null);
        assert_eq!(v["maxCostPerTaskUsd"], json!("2.5"));
    }

    #[test]
    fn empty_patch_changes_nothing() {
        assert_eq!(patch(json!({})).unwrap(), RepoSettings::default());
    }

    #[test]
    fn patch_is_pure() {
        let base = RepoSettings::default();
        let next = base.apply_patch(&json!({"autoReview": false})).unwrap();
        assert!(!next.auto_review);
        assert!(base.auto_review);
    }

    #[test]
    fn full_patch() {
        let s = patch(json!({
            "codingModel": "opus",
            "reviewModel": "sonnet",
            "maxTurnsCoding": 1000,
            "maxTurnsReview": 1,
            "agentType": "codex",
            "autoReview": false,
            "maxCostPerTaskUsd": "0.01",
            "monthlyBudgetUsd": "0",
            "egressAllow": ["PyPI.org", "*.githubusercontent.com"],
            "maxRevisions": 7,
            "reviseOnAgentReview": true,
            "allowProviderTools": true,
        }))
        .unwrap();
        assert_eq!(
            s,
            RepoSettings {
                coding_model: "opus".into(),
                review_model: "sonnet".into(),
                max_turns_coding: Some(1000),
                max_turns_review: 1,
                agent_type: AgentType::Codex,
                auto_review: false,
                max_cost_per_task_usd: Some(Usd::parse("0.01").unwrap()),
                monthly_budget_usd: Some(Usd::ZERO),
                egress_allow: vec![
                    EgressPattern::parse("pypi.org").unwrap(),
                    EgressPattern::parse("*.githubusercontent.com").unwrap(),
                ],
                max_revisions: 7,
                revise_on_agent_review: true,
                allow_provider_tools: true,
            }
        );
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn turn_bounds() {
        for member in [MAX_TURNS_CODING, MAX_TURNS_REVIEW] {
            for ok in [1, 2, 999, 1000] {
                let s = patch(json!({ member: ok })).unwrap();
                let got = if member == MAX_TURNS_CODING {
                    s.max_turns_coding
                } else {
                    Some(s.max_turns_review)
                };
                assert_eq!(got, Some(ok));
            }
            for bad in [
                json!(0),
                json!(1001),
                json!(-1),
                json!(2_147_483_648_i64),
                json!(-2_147_483_649_i64),
                json!(u64::MAX),
                json!(1.5),
                json!(5.0),
                json!("5"),
                json!(true),
                json!([5]),
                json!({"value": 5}),
            ] {
                refused(member, bad);
            }
        }
        assert_eq!(
            refused(MAX_TURNS_REVIEW, json!(0)).message,
            "must be an integer from 1 to 1000"
        );
        assert_eq!(
            refused(MAX_TURNS_CODING, json!(0)).message,
            "must be an integer from 1 to 1000, or null"
        );
        // null clears the coding limit but is refused for the review limit.
        assert_eq!(
            patch(json!({"maxTurnsCoding": null}))
                .unwrap()
                .max_turns_coding,
            None
        );
        refused(MAX_TURNS_REVIEW, Value::Null);
    }

    #[test]
    fn model_bounds() {
        for member in [CODING_MODEL, REVIEW_MODEL] {
            let hundred = "m".repeat(100);
            for ok in [
                "x",
                "claude-opus-4",
                "us.anthropic/claude-3.5_sonnet:beta",
                "gpt-5-codex",
                hundred.as_str(),
            ] {
                let s = patch(json!({ member: ok })).unwrap();
                let got = if member == CODING_MODEL {
                    s.coding_model
                } else {
                    s.review_model
                };
                assert_eq!(got, ok);
            }
            for bad in [
                json!(""),
                json!(" "),
                json!("\t\n"),
                json!("m".repeat(101)),
                json!("é".repeat(101)),
                // A model name becomes an argument of the agent's command line.
                json!("é"),
                json!("-m"),
                json!("--dangerously-skip-permissions"),
                json!("opus --verbose"),
                json!("opus;rm"),
                json!("opus\n"),
                json!(" opus"),
                json!("$(id)"),
                json!(null),
                json!(5),
                json!(true),
            ] {
                let err = refused(member, bad);
                assert_eq!(err.message, MODEL_RULE);
            }
        }
    }

    #[test]
    fn agent_type_values() {
        assert_eq!(
            patch(json!({"agentType": "codex"})).unwrap().agent_type,
            AgentType::Codex
        );
        assert_eq!(
            patch(json!({"agentType": "claude-code"}))
                .unwrap()
                .agent_type,
            AgentType::ClaudeCode
        );
        for bad in [
            json!("claude_code"),
            json!("Codex"),
            json!(""),
            json!(null),
            json!(1),
        ] {
            assert_eq!(refused(AGENT_TYPE, bad).message, AGENT_RULE);
        }
    }

    /// Switching the agent switches the models the patch does not name to that agent's
    /// defaults; models named in the same patch are kept; the same agent changes nothing.
    #[test]
    fn switching_the_agent_switches_unnamed_models_to_its_defaults() {
        let codex = patch(json!({"agentType": "codex"})).unwrap();
        assert_eq!(
            (codex.coding_model.as_str(), codex.review_model.as_str()),
            ("gpt-6.1-sol", "gpt-6-luna")
        );
        let named = patch(json!({"agentType": "codex", "codingModel": "gpt-5.5"})).unwrap();
        assert_eq!(
            (named.coding_model.as_str(), named.review_model.as_str()),
            ("gpt-5.5", "gpt-6-luna")
        );
        let back = codex
            .apply_patch(&json!({"agentType": "claude-code", "reviewModel": "opus"}))
            .unwrap();
        assert_eq!(
            (back.coding_model.as_str(), back.review_model.as_str()),
            ("sonnet", "opus")
        );
        let same = named.apply_patch(&json!({"agentType": "codex"})).unwrap();
        assert_eq!(same, named);
        // A task of the other agent runs with that agent's defaults.
        let claude = RepoSettings::default();
        assert_eq!(claude.model_for(AgentType::ClaudeCode, false), "sonnet");
        assert_eq!(claude.model_for(AgentType::Codex, false), "gpt-6.1-sol");
        assert_eq!(claude.model_for(AgentType::Codex, true), "gpt-6-luna");
        assert_eq!(named.model_for(AgentType::Codex, false), "gpt-5.5");
    }

    #[test]
    fn revision_settings() {
        let d = RepoSettings::default();
        assert_eq!((d.max_revisions, d.revise_on_agent_review), (3, false));
        let next = patch(json!({"maxRevisions": 0, "reviseOnAgentReview": true})).unwrap();
        assert_eq!((next.max_revisions, next.revise_on_agent_review), (0, true));
        assert_eq!(
            patch(json!({"maxRevisions": 50})).unwrap().max_revisions,
            50
        );
        for bad in [json!(-1), json!(51), json!(2.5), json!("3"), json!(null)] {
            let err = patch(json!({ "maxRevisions": bad })).unwrap_err();
            assert_eq!(err.field, "maxRevisions");
        }
        let err = patch(json!({"reviseOnAgentReview": "yes"})).unwrap_err();
        assert_eq!(err.field, "reviseOnAgentReview");
    }

    /// `allowProviderTools` is off by default, a patch turns it on and off, and anything but
    /// a JSON boolean is refused naming it, changing nothing.
    #[test]
    fn provider_tools_setting() {
        let d = RepoSettings::default();
        assert!(!d.allow_provider_tools);
        let on = patch(json!({"allowProviderTools": true})).unwrap();
        assert!(on.allow_provider_tools);
        assert_eq!(
            on,
            RepoSettings {
                allow_provider_tools: true,
                ..RepoSettings::default()
            }
        );
        let off = on
            .apply_patch(&json!({"allowProviderTools": false}))
            .unwrap();
        assert!(!off.allow_provider_tools);
        for bad in [
            json!("true"),
            json!(1),
            json!(0),
            json!(null),
            json!([true]),
        ] {
            assert_eq!(refused(ALLOW_PROVIDER_TOOLS, bad).message, BOOL_RULE);
        }
        let err = on
            .apply_patch(&json!({"allowProviderTools": false, "maxTurnsReview": 0}))
            .unwrap_err();
        assert_eq!(err.field, MAX_TURNS_REVIEW);
        // The unknown-member message lists it.
        assert!(
            refused("allowProviderTool", json!(true))
                .message
                .contains("allowProviderTools")
        );
    }

    #[test]
    fn auto_review_values() {
        assert!(!patch(json!({"autoReview": false})).unwrap().auto_review);
        assert!(patch(json!({"autoReview": true})).unwrap().auto_review);
        for bad in [json!("true"), json!(1), json!(null)] {
            assert_eq!(refused(AUTO_REVIEW, bad).message, BOOL_RULE);
        }
    }

    #[test]
    fn cost_cap_values() {
        assert_eq!(
            patch(json!({"maxCostPerTaskUsd": "0.01"}))
                .unwrap()
                .max_cost_per_task_usd,
            Some(Usd::parse("0.01").unwrap())
        );
        let with_cap = patch(json!({"maxCostPerTaskUsd": "5"})).unwrap();
        assert_eq!(
            with_cap
                .apply_patch(&json!({"maxCostPerTaskUsd": null}))
                .unwrap()
                .max_cost_per_task_usd,
            None
        );
        assert_eq!(
            refused(MAX_COST_PER_TASK_USD, json!("0")).message,
            COST_RULE
        );
        assert_eq!(
            refused(MAX_COST_PER_TASK_USD, json!("-1")).message,
            "must not be negative"
        );
        assert_eq!(
            refused(MAX_COST_PER_TASK_USD, json!("0.0000000001")).message,
            "must have at most 9 decimal places"
        );
        for bad in [
            json!("1e3"),
            json!(5),
            json!(0.5),
            json!(""),
            json!(" 1"),
            json!(true),
        ] {
            assert_eq!(refused(MAX_COST_PER_TASK_USD, bad).message, COST_RULE);
        }
    }

    #[test]
    fn unknown_member() {
        let err = refused("maxTurns", json!(5));
        assert!(err.message.starts_with("unknown setting"), "{err}");
        assert!(err.message.contains("maxTurnsCoding"), "{err}");
        // Member names are case-sensitive camelCase.
        refused("coding_model", json!("opus"));
    }

    #[test]
    fn non_object_bodies() {
        for body in [
            json!(null),
            json!([]),
            json!("x"),
            json!(1),
            json!(true),
            json!([{"autoReview": false}]),
        ] {
            let err = patch(body).unwrap_err();
            assert_eq!(err.field, "body");
        }
    }

    #[test]
    fn patch_is_all_or_nothing() {
        let err = patch(json!({"autoReview": false, "maxTurnsReview": 0})).unwrap_err();
        assert_eq!(err.field, MAX_TURNS_REVIEW);
        let err = patch(json!({"zzz": 1, "codingModel": "opus"})).unwrap_err();
        assert_eq!(err.field, "zzz");
    }

    #[test]
    fn validate_checks_bounds() {
        let ok = RepoSettings::default();
        let cases = [
            (
                RepoSettings {
                    coding_model: " ".into(),
                    ..ok.clone()
                },
                CODING_MODEL,
            ),
            (
                RepoSettings {
                    review_model: "r".repeat(101),
                    ..ok.clone()
                },
                REVIEW_MODEL,
            ),
            (
                RepoSettings {
                    max_turns_coding: Some(0),
                    ..ok.clone()
                },
                MAX_TURNS_CODING,
            ),
            (
                RepoSettings {
                    max_turns_review: 1001,
                    ..ok.clone()
                },
                MAX_TURNS_REVIEW,
            ),
            (
                RepoSettings {
                    max_cost_per_task_usd: Some(Usd::ZERO),
                    ..ok.clone()
                },
                MAX_COST_PER_TASK_USD,
            ),
            (
                RepoSettings {
                    egress_allow: vec![EgressPattern::parse("a.org").unwrap(); 101],
                    ..ok.clone()
                },
                EGRESS_ALLOW,
            ),
        ];
        for (settings, field) in cases {
            assert_eq!(settings.validate().unwrap_err().field, field);
        }
        let unlimited = RepoSettings {
            max_turns_coding: None,
            max_cost_per_task_usd: Some(Usd::parse("100").unwrap()),
            ..ok
        };
        assert_eq!(unlimited.validate(), Ok(()));
    }

    #[test]
    fn monthly_budgets_are_exact_non_negative_or_null() {
        let base = RepoSettings::default();
        let set = base
            .apply_patch(&json!({"monthlyBudgetUsd": "500.123456789"}))
            .unwrap();
        assert_eq!(
            set.monthly_budget_usd,
            Some(Usd::parse("500.123456789").unwrap())
        );
        let zero = base.apply_patch(&json!({"monthlyBudgetUsd": "0"})).unwrap();
        assert_eq!(zero.monthly_budget_usd, Some(Usd::ZERO));
        let cleared = set.apply_patch(&json!({"monthlyBudgetUsd": null})).unwrap();
        assert_eq!(cleared.monthly_budget_usd, None);
        for bad in [
            json!("-1"),
            json!("abc"),
            json!("1.0000000001"),
            json!(5),
            json!(true),
        ] {
            let e = base
                .apply_patch(&json!({ "monthlyBudgetUsd": bad }))
                .unwrap_err();
            assert_eq!(e.field, "monthlyBudgetUsd", "{bad}");
        }
    }

    /// `egressAllow` replaces the list with the normalised patterns, each once; `[]`
    /// clears it; a bad element is named with its index and nothing changes.
    #[test]
    fn egress_allow_holds_normalised_patterns() {
        let set = patch(json!({"egressAllow": [
            "PyPI.org.", "*.GitHubUserContent.com", "[::1]", "127.0.0.1", "pypi.org",
            "pypi.org:443", "PyPI.org:8080", "[::1]:8080", "*.npmjs.org:8443"
        ]}))
        .unwrap();
        assert_eq!(
            serde_json::to_value(&set).unwrap()["egressAllow"],
            json!([
                "pypi.org",
                "*.githubusercontent.com",
                "::1",
                "127.0.0.1",
                "pypi.org:8080",
                "[::1]:8080",
                "*.npmjs.org:8443"
            ])
        );
        assert_eq!(set.validate(), Ok(()));
        let replaced = set.apply_patch(&json!({"egressAllow": ["a.org"]})).unwrap();
        assert_eq!(
            replaced.egress_allow,
            [EgressPattern::parse("a.org").unwrap()]
        );
        let cleared = set.apply_patch(&json!({"egressAllow": []})).unwrap();
        assert!(cleared.egress_allow.is_empty());
        let hundred: Vec<String> = (0..100).map(|i| format!("h{i}.example.com")).collect();
        assert_eq!(
            patch(json!({ "egressAllow": hundred }))
                .unwrap()
                .egress_allow
                .len(),
            100
        );

        let err = set
            .apply_patch(
                &json!({"autoReview": false, "egressAllow": ["a.org", "b.org", "https://x"]}),
            )
            .unwrap_err();
        assert_eq!(err.field, "egressAllow[2]");
        assert_eq!(
            err.to_string(),
            "egressAllow[2]: a URL is not a host name; give the host only, e.g. \"pypi.org\""
        );
        for (bad, field) in [
            (json!(["pypi.org:0"]), "egressAllow[0]"),
            (json!(["ok.org", "*"]), "egressAllow[1]"),
            (json!(["*.com"]), "egressAllow[0]"),
            (json!(["a b"]), "egressAllow[0]"),
            (json!([""]), "egressAllow[0]"),
            (json!(["a.org", 5]), "egressAllow[1]"),
            (json!([null]), "egressAllow[0]"),
            (json!("pypi.org"), EGRESS_ALLOW),
            (json!(null), EGRESS_ALLOW),
            (json!({"0": "pypi.org"}), EGRESS_ALLOW),
        ] {
            let err = patch(json!({ "egressAllow": bad })).unwrap_err();
            assert_eq!(err.field, field, "{bad}");
        }
        let too_many: Vec<String> = (0..101).map(|i| format!("h{i}.example.com")).collect();
        assert_eq!(refused(EGRESS_ALLOW, json!(too_many)).message, EGRESS_RULE);
    }
}
