//! The two agent CLIs as processes (SPEC §6.2): how each is invoked, which API-key variables
//! it may see, and which parser reads its output.
//!
//! | agent | command line (prompt on stdin) |
//! |---|---|
//! | `claude-code` | `claude -p --output-format stream-json --verbose --model M [--max-turns N] [--max-budget-usd B] --permission-mode acceptEdits` |
//! | `codex` | `codex exec --json --model M --full-auto -` |
//!
//! `--permission-mode acceptEdits` lets Claude Code edit files without asking (a headless run
//! has nobody to ask); `--full-auto` is Codex's equivalent (workspace-write sandbox). Codex
//! has no turn or budget limit on its command line: for Codex runs those settings are not
//! enforced by the agent, only the wall-time limit is.

use std::path::{Path, PathBuf};

use agentry_domain::AgentType;
use agentry_domain::money::Usd;

use crate::process::AgentCommand;
use crate::{PriceTable, RunReport, parse_claude, parse_codex};

/// How to launch the agent of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    /// Which CLI.
    pub agent_type: AgentType,
    /// The model it is launched with (the repository's `codingModel` or `reviewModel`).
    pub model: String,
    /// The turn limit, if any (Claude Code only).
    pub max_turns: Option<i32>,
    /// The most the run may spend, if capped (Claude Code's `--max-budget-usd`).
    pub max_budget_usd: Option<Usd>,
}

/// The environment variables through which an operator gives an agent its API key. Only
/// these (when set for the service) reach the agent, besides `PATH` and `HOME`.
pub fn api_key_vars(agent_type: AgentType) -> &'static [&'static str] {
    match agent_type {
        AgentType::ClaudeCode => &["ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"],
        AgentType::Codex => &["OPENAI_API_KEY", "CODEX_API_KEY"],
    }
}

/// The arguments of an agent's command line (after the program name).
pub fn arguments(spec: &AgentSpec) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    match spec.agent_type {
        AgentType::ClaudeCode => {
            args.extend(
                [
                    "-p",
                    "--output-format",
                    "stream-json",
                    "--verbose",
                    "--model",
                ]
                .map(str::to_owned),
            );
            args.push(spec.model.clone());
            if let Some(turns) = spec.max_turns {
                args.push("--max-turns".into());
                args.push(turns.to_string());
            }
            if let Some(budget) = spec.max_budget_usd {
                args.push("--max-budget-usd".into());
                args.push(budget.to_string());
            }
            args.push("--permission-mode".into());
            args.push("acceptEdits".into());
        }
        AgentType::Codex => {
            args.extend(["exec", "--json", "--model"].map(str::to_owned));
            args.push(spec.model.clone());
            args.push("--full-auto".into());
            args.push("-".into());
        }
    }
    args
}

/// The process of one agent run: `program` with [`arguments`], the prompt on stdin, in
/// `cwd` (the worktree), with exactly `env`.
pub fn command(
    spec: &AgentSpec,
    program: &Path,
    prompt: &str,
    cwd: &Path,
    env: Vec<(String, String)>,
) -> AgentCommand {
    AgentCommand {
        program: PathBuf::from(program),
        args: arguments(spec),
        stdin: prompt.to_owned(),
        cwd: cwd.to_owned(),
        env,
    }
}

/// Reads an agent's output with the parser of its CLI. Codex reports tokens only; they are
/// priced for the model the run was launched with.
pub fn parse_output(spec: &AgentSpec, output: &str, prices: &PriceTable) -> RunReport {
    match spec.agent_type {
        AgentType::ClaudeCode => parse_claude(output),
        AgentType::Codex => parse_codex(output, &spec.model, prices),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn claude_command_line_carries_model_limits_and_budget() {
        let spec = AgentSpec {
            agent_type: AgentType::ClaudeCode,
            model: "sonnet".into(),
            max_turns: Some(40),
            max_budget_usd: Some(Usd::parse("2.50").unwrap()),
        };
        assert_eq!(
            arguments(&spec).join(" "),
            "-p --output-format stream-json --verbose --model sonnet --max-turns 40 \
             --max-budget-usd 2.5 --permission-mode acceptEdits"
        );
        let unlimited = AgentSpec {
            max_turns: None,
            max_budget_usd: None,
            ..spec
        };
        assert!(!arguments(&unlimited).iter().any(|a| a.starts_with("--max")));
    }

    #[test]
    fn codex_reads_the_prompt_from_stdin() {
        let spec = AgentSpec {
            agent_type: AgentType::Codex,
            model: "gpt-5-codex".into(),
            max_turns: Some(40),
            max_budget_usd: None,
        };
        assert_eq!(
            arguments(&spec).join(" "),
            "exec --json --model gpt-5-codex --full-auto -"
        );
    }
}
