//! The parsers over recorded samples of each CLI's output, the price table, and
//! never-panic properties.

use crate::support::{assert_warned, fixture};
use agentry_domain::AgentType;
use agentry_domain::money::Usd;
use agentry_runner::agent::{AgentSpec, MAX_LINE_BYTES, OutputParser};
use agentry_runner::{
    AgentOutcome, PriceError, PriceTable, RunReport, Tokens, parse_claude, parse_codex,
};
use proptest::prelude::*;

fn usd(text: &str) -> Usd {
    Usd::parse(text).unwrap()
}

fn cost(report: &RunReport) -> Option<String> {
    report.cost_usd.map(|c| c.to_string())
}

/// What the sample tests check of a report, compared at once: all of it but the reason a
/// cost is unknown and the warnings' text; the cost as its decimal text, the tokens as
/// (all input, cache read, cache write, output).
#[derive(Debug, PartialEq)]
struct Figures<'a> {
    outcome: AgentOutcome,
    cost: Option<&'a str>,
    model: Option<&'a str>,
    tokens: (i64, i64, i64, i64),
    turns: Option<i32>,
    final_text: Option<&'a str>,
    warnings: usize,
}

impl<'a> Figures<'a> {
    /// The figures of a run that counted nothing: `outcome` with no cost, no tokens and no
    /// final text, only the `model` and `turns` seen and `warnings`.
    fn nothing_counted(
        outcome: AgentOutcome,
        model: &'a str,
        turns: Option<i32>,
        warnings: usize,
    ) -> Figures<'a> {
        Figures {
            outcome,
            cost: None,
            model: Some(model),
            tokens: (0, 0, 0, 0),
            turns,
            final_text: None,
            warnings,
        }
    }
}

/// Checks `report` against `expected`, showing the whole report when they differ.
#[track_caller]
fn assert_figures(report: &RunReport, expected: Figures<'_>) {
    let cost = cost(report);
    let actual = Figures {
        outcome: report.outcome.clone(),
        cost: cost.as_deref(),
        model: report.model.as_deref(),
        tokens: (
            report.tokens.input,
            report.tokens.cache_read,
            report.tokens.cache_write,
            report.tokens.output,
        ),
        turns: report.turns,
        final_text: report.final_text.as_deref(),
        warnings: report.warnings.len(),
    };
    assert_eq!(actual, expected, "{report:#?}");
}

/// Asserts that a warning says line `line` of the output was skipped as not JSON.
#[track_caller]
fn assert_skipped_line(report: &RunReport, line: usize) {
    let start = format!("line {line}: not JSON");
    assert!(
        report.warnings.iter().any(|w| w.starts_with(&start)),
        "no warning starting {start:?}: {:?}",
        report.warnings
    );
}

/// The fixture `name` as Codex output of `model`, priced with the built-in table.
fn codex_fixture(name: &str, model: &str) -> RunReport {
    parse_codex(&fixture(name), model, &PriceTable::builtin())
}

// ---------------------------------------------------------------- Claude Code

#[test]
fn claude_success() {
    let r = parse_claude(&fixture("claude_success.jsonl"));
    assert_figures(
        &r,
        Figures {
            outcome: AgentOutcome::Success,
            cost: Some("0.123456"),
            // The costlier of the two models, not the first nor the init one by accident.
            model: Some("claude-sonnet-4-5-20250929"),
            // haiku 1203 + sonnet (26 + 74989 read + 9624 write).
            tokens: (1203 + 26 + 74_989 + 9_624, 74_989, 9_624, 61 + 1562),
            turns: Some(7),
            final_text: Some("Fixed the panic in `parse` by returning a `Result`; all tests pass."),
            warnings: 0,
        },
    );
    assert!(r.outcome.is_success());
}

#[test]
fn claude_max_turns_rounds_float_noise() {
    assert_figures(
        &parse_claude(&fixture("claude_max_turns.jsonl")),
        Figures {
            outcome: AgentOutcome::MaxTurns,
            // 0.10837215000000001 in the JSON text, rounded to nano-dollars.
            cost: Some("0.10837215"),
            model: Some("claude-opus-4-1-20250805"),
            tokens: (61 + 210_455 + 31_077, 210_455, 31_077, 2208),
            turns: Some(11),
            final_text: None,
            warnings: 0,
        },
    );
}

#[test]
fn claude_max_budget_with_exponent_cost() {
    assert_figures(
        &parse_claude(&fixture("claude_max_budget.jsonl")),
        Figures {
            outcome: AgentOutcome::MaxBudget,
            cost: Some("0.000012"),
            model: Some("claude-sonnet-4-5-20250929"),
            tokens: (5, 0, 0, 1),
            turns: Some(23),
            final_text: None,
            warnings: 0,
        },
    );
}

#[test]
fn claude_error_during_execution() {
    let r = parse_claude(&fixture("claude_error_during_execution.jsonl"));
    assert_figures(
        &r,
        Figures {
            outcome: AgentOutcome::Error(
                r#"error_during_execution: API Error: 529 {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
                    .into(),
            ),
            cost: Some("0.0311535"),
            model: Some("claude-sonnet-4-5-20250929"),
            tokens: (8003, 0, 8000, 20),
            turns: Some(2),
            final_text: None,
            warnings: 1,
        },
    );
    // The stderr noise on line 2 is skipped with a warning naming the line.
    assert_skipped_line(&r, 2);
}

#[test]
fn claude_truncated_is_unparseable_without_cost() {
    let r = parse_claude(&fixture("claude_truncated.jsonl"));
    assert_figures(
        &r,
        // The init event's model is still reported.
        Figures::nothing_counted(
            AgentOutcome::Unparseable(
                "the output ended without a result event (cut off?); Claude Code reports cost \
                 and tokens only in that event, so none are known"
                    .into(),
            ),
            "claude-haiku-4-5-20251001",
            None,
            1,
        ),
    );
    assert_skipped_line(&r, 3);
}

#[test]
fn claude_model_choice_compares_costs_exactly() {
    // As f64 both costs are equal (1e-17 apart); exactly, "b" is costlier by less than a
    // nano-dollar, so after rounding they tie and the first name in sorted order wins.
    let tie = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"ok","total_cost_usd":0.3,"modelUsage":{"b":{"costUSD":0.15000000000000002},"a":{"costUSD":0.15}}}"#;
    assert_eq!(parse_claude(tie).model.as_deref(), Some("a"));
    let larger = r#"{"type":"result","subtype":"success","num_turns":1,"total_cost_usd":0.3,"modelUsage":{"a":{"costUSD":0.1},"b":{"costUSD":0.100000001}}}"#;
    assert_eq!(parse_claude(larger).model.as_deref(), Some("b"));
    // No modelUsage costs → the init model.
    let init = "{\"type\":\"system\",\"subtype\":\"init\",\"model\":\"m-init\"}\n\
                {\"type\":\"result\",\"subtype\":\"success\",\"total_cost_usd\":0,\"modelUsage\":{}}";
    let r = parse_claude(init);
    assert_eq!(r.model.as_deref(), Some("m-init"));
    assert_eq!(r.cost_usd, Some(Usd::ZERO));
}

#[test]
fn claude_bad_figures_are_warnings_never_fake_numbers() {
    let text = r#"{"type":"result","subtype":"success","num_turns":-3,"total_cost_usd":-0.5,"modelUsage":{"x":{"inputTokens":1.5,"outputTokens":7,"costUSD":"0.1"}}}"#;
    let r = parse_claude(text);
    assert_eq!(r.cost_usd, None);
    assert_eq!(r.turns, None);
    assert_eq!((r.tokens.input, r.tokens.output), (0, 7));
    assert_eq!(r.model, None);
    assert_eq!(r.warnings.len(), 4, "{:?}", r.warnings);
    assert_warned(&r, "total_cost_usd");
    // A result event of the wrong shape is unparseable, not a crash.
    let r = parse_claude(r#"{"type":"result","subtype":7}"#);
    assert!(
        matches!(r.outcome, AgentOutcome::Unparseable(_)),
        "{:?}",
        r.outcome
    );
    // Two result events: the last counts.
    let two = "{\"type\":\"result\",\"subtype\":\"error_max_turns\",\"total_cost_usd\":1}\n\
               {\"type\":\"result\",\"subtype\":\"success\",\"total_cost_usd\":2}";
    let r = parse_claude(two);
    assert_eq!(
        (r.outcome.clone(), r.cost_usd),
        (AgentOutcome::Success, Some(usd("2")))
    );
    assert_warned(&r, "2 result events");
    // Empty output.
    assert!(matches!(
        parse_claude("").outcome,
        AgentOutcome::Unparseable(_)
    ));
}

#[test]
fn claude_success_subtype_with_is_error_is_an_error() {
    let text = r#"{"type":"result","subtype":"success","is_error":true,"result":"Invalid API key · Please run /login","total_cost_usd":0}"#;
    assert_eq!(
        parse_claude(text).outcome,
        AgentOutcome::Error("success: Invalid API key · Please run /login".into())
    );
}

// ---------------------------------------------------------------------- Codex

#[test]
fn codex_success_prices_tokens_exactly() {
    assert_figures(
        &codex_fixture("codex_success.jsonl", "gpt-5-codex"),
        Figures {
            outcome: AgentOutcome::Success,
            // (500315·1.25 + 524448·0.125 + 100122·10) / 10⁶ = 1.69216975
            cost: Some("1.69216975"),
            model: Some("gpt-5-codex"),
            tokens: (24_763 + 1_000_000, 24_448 + 500_000, 0, 122 + 100_000),
            turns: Some(2),
            final_text: Some("Fixed the off-by-one in `split_at`; all 13 tests pass."),
            warnings: 0,
        },
    );
}

#[test]
fn codex_unpriced_model_has_no_cost_and_a_warning() {
    let r = codex_fixture("codex_success.jsonl", "gpt-9-turbo");
    assert_eq!(r.cost_usd, None);
    assert_eq!(r.tokens.output, 100_122);
    assert_eq!(r.warnings.len(), 1);
    assert!(
        r.warnings[0].contains("\"gpt-9-turbo\""),
        "{:?}",
        r.warnings
    );
}

#[test]
fn codex_turn_failed() {
    assert_figures(
        &codex_fixture("codex_turn_failed.jsonl", "gpt-5-codex"),
        Figures {
            outcome: AgentOutcome::Error(
                "turn failed: stream disconnected before completion: Rate limit reached for \
                 gpt-5-codex"
                    .into(),
            ),
            // The completed turn's tokens are still priced: (5000·1.25 + 300·10) / 10⁶.
            cost: Some("0.00925"),
            model: Some("gpt-5-codex"),
            tokens: (5000, 0, 0, 300),
            turns: Some(1),
            final_text: Some("Starting on the migration."),
            warnings: 0,
        },
    );
}

#[test]
fn codex_error_then_completed_turn_is_a_warning() {
    let text = "{\"type\":\"error\",\"message\":\"Reconnecting... 1/5\"}\n\
                {\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":10,\"cached_input_tokens\":0,\"output_tokens\":1}}";
    let r = parse_codex(text, "gpt-5", &PriceTable::builtin());
    assert_eq!(r.outcome, AgentOutcome::Success);
    assert_warned(&r, "Reconnecting");
}

#[test]
fn codex_truncated_is_unparseable() {
    let r = codex_fixture("codex_truncated.jsonl", "gpt-5");
    assert_figures(
        &r,
        Figures::nothing_counted(
            AgentOutcome::Unparseable(
                "the output has no turn.completed event (cut off?); no token usage is known".into(),
            ),
            "gpt-5",
            Some(0),
            2,
        ),
    );
    assert_skipped_line(&r, 4);
}

/// The running cost of a Codex run is the exact price of the usage events read so far:
/// it changes only when a `turn.completed` line is complete, it ends equal to the report's
/// cost, and the allowance is reached once it is at least the allowance.
#[test]
fn codex_cost_so_far_prices_each_usage_event_as_it_arrives() {
    let output = fixture("codex_success.jsonl");
    let spec = |allowance: &str| AgentSpec {
        max_budget_usd: Some(usd(allowance)),
        ..AgentSpec::unlimited(AgentType::Codex, "gpt-5-codex")
    };
    // (315·1.25 + 24448·0.125 + 122·10) / 10⁶ for the first turn; both turns as above.
    let (first, both) = (usd("0.00466975"), usd("1.69216975"));
    for (allowance, reached_after) in [
        ("0.001", Some(first)),
        ("0.00466975", Some(first)),
        ("0.00466976", Some(both)),
        ("1.69216975", Some(both)),
        ("1.69216976", None),
    ] {
        let mut parser = OutputParser::new(&spec(allowance), &PriceTable::builtin());
        assert_eq!(parser.cost_so_far(), Some(Usd::ZERO));
        let mut seen = vec![Usd::ZERO];
        let mut reached = None;
        // Byte by byte: a usage line counts only once its newline has arrived.
        for byte in output.as_bytes() {
            parser.feed(std::slice::from_ref(byte));
            let cost = parser.cost_so_far().unwrap();
            if seen.last() != Some(&cost) {
                assert_eq!(*byte, b'\n', "the cost changed inside a line");
                seen.push(cost);
            }
            if reached.is_none() && parser.allowance_reached() {
                reached = Some(cost);
            }
        }
        assert_eq!(seen, [Usd::ZERO, first, both], "{allowance}");
        assert_eq!(reached, reached_after, "{allowance}");
        assert_eq!(parser.finish().cost_usd, Some(both));
    }

    // Without an allowance, or on an unpriced model, the allowance is never reached.
    let mut parser = OutputParser::codex("gpt-5-codex", &PriceTable::builtin());
    parser.feed(output.as_bytes());
    assert_eq!(parser.cost_so_far(), Some(both));
    assert!(!parser.allowance_reached());
    let mut parser =
        OutputParser::codex("gpt-9-turbo", &PriceTable::builtin()).with_allowance(Some(Usd::ZERO));
    parser.feed(output.as_bytes());
    assert_eq!(parser.cost_so_far(), None);
    assert!(!parser.allowance_reached());
    // Claude Code reports its cost only at the end and stops at its own budget.
    let mut parser = OutputParser::claude().with_allowance(Some(Usd::ZERO));
    parser.feed(fixture("claude_success.jsonl").as_bytes());
    assert_eq!(parser.cost_so_far(), None);
    assert!(!parser.allowance_reached());
}

// ------------------------------------------- recorded from the real CLIs (fixtures/README.md)

/// The JSON number text of `"key":` in the last line of `text` that has it: what the CLI
/// printed, before any parsing.
fn printed_number(text: &str, key: &str) -> String {
    let needle = format!("\"{key}\":");
    let line = text.lines().rfind(|l| l.contains(&needle)).unwrap();
    let start = line.find(&needle).unwrap() + needle.len();
    line[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
        .collect()
}

/// A printed cost as agentry records it: the exact decimal of the text, rounded half away
/// from zero to nano-dollars (9 decimals); here checked against the binary float the CLI
/// summed, rounded the same way.
fn recorded_from_float(printed: &str) -> Usd {
    let float: f64 = printed.parse().unwrap();
    #[allow(clippy::cast_possible_truncation, reason = "small test amounts")]
    Usd::from_nanos((float * 1e9).round() as i64).unwrap()
}

/// The recorded Claude Code output `name`, parsed, after checking that it printed the cost
/// `printed` and that the report has it as [`recorded_from_float`] rounds it.
fn claude_real(name: &str, printed: &str) -> RunReport {
    let text = fixture(name);
    assert_eq!(printed_number(&text, "total_cost_usd"), printed);
    let r = parse_claude(&text);
    assert_eq!(r.cost_usd, Some(recorded_from_float(printed)), "{name}");
    r
}

#[test]
fn claude_real_success() {
    assert_figures(
        &claude_real("claude_real_success.jsonl", "0.0195"),
        Figures {
            outcome: AgentOutcome::Success,
            cost: Some("0.0195"),
            model: Some("claude-sonnet-5"),
            // modelUsage, the side request included: 2400 in + 8000 cache read + 2000 cache
            // write.
            tokens: (2400 + 8000 + 2000, 8000, 2000, 160),
            // One tool call and the final answer.
            turns: Some(2),
            final_text: Some(
                "Done: added a line to AGENT_NOTES.md. (fake-models run r7e74d5b2fb9d)",
            ),
            warnings: 0,
        },
    );
}

/// A binary-float cost (`0.006500000000000001`) is recorded as the printed number rounded
/// to 9 decimals: 0.0065.
#[test]
fn claude_real_review_in_a_bare_mirror_worktree() {
    let printed = "0.006500000000000001";
    let r = claude_real("claude_real_review_bare_mirror_worktree.jsonl", printed);
    assert_eq!(r.cost_usd, Some(Usd::from_json_number(printed).unwrap()));
    assert_figures(
        &r,
        Figures {
            outcome: AgentOutcome::Success,
            cost: Some("0.0065"),
            model: Some("claude-haiku-4-5-20251001"),
            tokens: (2400 + 8000 + 2000, 8000, 2000, 160),
            turns: Some(2),
            // The refused `git diff` is in the final text, not an error of the run.
            final_text: Some(
                "fake-models review (fake-models run rc80d4f1502e1). Looks fine. What the \
                 command gave: refused: This command requires approval",
            ),
            warnings: 0,
        },
    );
}

#[test]
fn claude_real_max_budget() {
    let r = claude_real("claude_real_max_budget.jsonl", "1.5007500000000003");
    assert_figures(
        &r,
        Figures {
            outcome: AgentOutcome::MaxBudget,
            // Over the $0.5 cap by the one call that crossed it.
            cost: Some("1.50075"),
            model: Some("claude-sonnet-5"),
            tokens: (400_200, 0, 0, 20_010),
            turns: Some(1),
            final_text: None,
            warnings: 0,
        },
    );
    assert_eq!(r.outcome.describe(), "the spending limit was reached");
}

#[test]
fn claude_real_api_error() {
    let r = parse_claude(&fixture("claude_real_api_error.jsonl"));
    assert_figures(
        &r,
        Figures {
            outcome: AgentOutcome::ApiError {
                status: Some(400),
                message: "fake-models refuses this request (API-ERROR)".into(),
            },
            // The session-title side request was answered and is paid for.
            cost: Some("0.00075"),
            model: Some("claude-sonnet-5"),
            tokens: (200, 0, 0, 10),
            turns: Some(1),
            final_text: Some("API Error: 400 fake-models refuses this request (API-ERROR)"),
            warnings: 0,
        },
    );
    assert_eq!(
        r.outcome.describe(),
        "model API error 400: fake-models refuses this request (API-ERROR)"
    );
    assert!(!r.outcome.is_success());
}

/// Recorded here: Claude Code answering SIGINT (what agentry sends first to stop a run)
/// with an `error_during_execution` result that has the cost so far.
#[test]
fn claude_real_sigint() {
    assert_figures(
        &parse_claude(&fixture("claude_real_sigint.jsonl")),
        Figures {
            outcome: AgentOutcome::Error(
                "error_during_execution: [ede_diagnostic] result_type=user \
                 last_content_type=n/a stop_reason=tool_use"
                    .into(),
            ),
            // The first call and the title request; the call interrupted is not in it.
            cost: Some("0.0129"),
            model: Some("claude-sonnet-5"),
            tokens: (1200 + 3000 + 2000, 3000, 2000, 60),
            turns: Some(3),
            final_text: None,
            warnings: 0,
        },
    );
}

/// Recorded here: `--max-turns 2`; the real CLI counts one more turn than its limit.
#[test]
fn claude_real_max_turns() {
    assert_figures(
        &parse_claude(&fixture("claude_real_max_turns.jsonl")),
        Figures {
            outcome: AgentOutcome::MaxTurns,
            cost: Some("0.02505"),
            model: Some("claude-sonnet-5"),
            tokens: (12_200, 6000, 4000, 110),
            turns: Some(3),
            final_text: None,
            warnings: 0,
        },
    );
}

/// `codex exec --json --model gpt-5`: one `turn.completed` at the end with every call
/// summed, priced with the built-in table; the metadata noise (an `error` item) is ignored.
#[test]
fn codex_real_exec() {
    assert_figures(
        &codex_fixture("codex_real_exec.jsonl", "gpt-5"),
        Figures {
            outcome: AgentOutcome::Success,
            // (5000 × 1.25 + 4000 × 0.125 + 210 × 10) / 10⁶
            cost: Some("0.00885"),
            model: Some("gpt-5"),
            tokens: (9000, 4000, 0, 210),
            turns: Some(1),
            final_text: Some(
                "Done: added a line to AGENT_NOTES.md. (fake-models run caca84b6f5718)",
            ),
            warnings: 0,
        },
    );
}

#[test]
fn codex_real_api_error() {
    let r = codex_fixture("codex_real_api_error.jsonl", "gpt-5");
    assert_figures(
        &r,
        Figures::nothing_counted(
            AgentOutcome::ApiError {
                status: Some(400),
                message: "fake-models refuses this request (API-ERROR)".into(),
            },
            "gpt-5",
            Some(0),
            1,
        ),
    );
    assert_eq!(
        r.outcome.describe(),
        "model API error 400: fake-models refuses this request (API-ERROR)"
    );
}

/// Recorded here: Codex stopped by SIGINT after one answered call prints no usage; its
/// session file (recorded with it) has the call, which agentry prices.
#[test]
fn codex_real_sigint_is_priced_from_its_session_file() {
    let stdout = fixture("codex_real_sigint.jsonl");
    let prices = PriceTable::builtin();
    let r = parse_codex(&stdout, "gpt-5", &prices);
    assert!(
        matches!(r.outcome, AgentOutcome::Unparseable(_)),
        "{:?}",
        r.outcome
    );
    assert_eq!(r.cost_usd, None);

    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join(".codex/sessions/2026/11/25");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("rollout-2026-11-25T21-48-35-01a214ae-95ae-70f2-872d-031c5e8dfcee.jsonl"),
        fixture("codex_real_sigint_rollout.jsonl"),
    )
    .unwrap();
    let mut parser = OutputParser::codex("gpt-5", &prices).with_codex_home(home.path(), &prices);
    parser.feed(stdout.as_bytes());
    parser.poll();
    // (2000 × 1.25 + 1000 × 0.125 + 100 × 10) / 10⁶, the model of the session's turn_context.
    assert_eq!(parser.cost_so_far(), Some(usd("0.003625")));
    let r = parser.finish();
    assert_eq!(r.cost_usd, Some(usd("0.003625")));
    assert_eq!(r.cost_unknown, None);
    assert_eq!(
        (
            r.tokens.input,
            r.tokens.cache_read,
            r.tokens.cache_write,
            r.tokens.output
        ),
        (3000, 1000, 0, 100)
    );
    assert_warned(&r, "the 1 model calls Codex recorded");
}

// ---------------------------------------------------------------- Price table

#[test]
fn builtin_prices() {
    let table = PriceTable::builtin();
    let p = table.get("gpt-5").unwrap();
    assert_eq!(p.input.to_string(), "1.25");
    assert_eq!(p.cached_input.to_string(), "0.125");
    assert_eq!(p.output.to_string(), "10");
    assert!(table.get("gpt-5-mini").is_some());
    assert!(table.get("GPT-5").is_none());
    assert!(table.models().count() >= 5);
}

#[test]
fn cost_rounds_half_away_from_zero_to_nanos() {
    let table = PriceTable::from_json(
        r#"{"tiny": {"input": "0.0005", "cachedInput": "0", "output": "0.00049"}}"#,
    )
    .unwrap();
    let p = table.get("tiny").unwrap();
    let tokens = |input, cache_read, cache_write, output| Tokens {
        input,
        cache_read,
        cache_write,
        output,
    };
    // 1 token at $0.0005/M = 5e-10 → rounds up to one nano-dollar.
    assert_eq!(p.cost(tokens(1, 0, 0, 0)), Some(usd("0.000000001")));
    // 1 token at $0.00049/M = 4.9e-10 → rounds to zero.
    assert_eq!(p.cost(tokens(0, 0, 0, 1)), Some(Usd::ZERO));
    // Cached above input is clamped; negative counts refused.
    assert_eq!(p.cost(tokens(2, 5, 0, 0)), Some(Usd::ZERO));
    assert_eq!(p.cost(tokens(-1, 0, 0, 0)), None);
    assert_eq!(p.cost(tokens(1, 0, -1, 0)), None);
    // Huge counts do not panic.
    let _ = PriceTable::builtin()
        .get("gpt-5")
        .unwrap()
        .cost(tokens(i64::MAX, 0, 0, i64::MAX));
}

/// Cache writes cost the cache-write price, or the input price when the model has none;
/// the cache parts never count for more than the input.
#[test]
fn cache_writes_are_priced_apart() {
    let table = PriceTable::from_json(
        r#"{"w": {"input": "2", "cachedInput": "0.1", "cacheWrite": "2.5", "output": "10"},
            "nw": {"input": "2", "cachedInput": "0.1", "output": "10"}}"#,
    )
    .unwrap();
    let t = Tokens {
        input: 10_000,
        cache_read: 4_000,
        cache_write: 1_000,
        output: 100,
    };
    // 5000·2 + 4000·0.1 + 1000·2.5 + 100·10 = 13 900 µ$.
    assert_eq!(table.get("w").unwrap().cost(t), Some(usd("0.0139")));
    // 6000·2 + 4000·0.1 + 100·10 = 13 400 µ$.
    assert_eq!(table.get("nw").unwrap().cost(t), Some(usd("0.0134")));
    let clamped = Tokens {
        input: 10,
        cache_read: 8,
        cache_write: 8,
        output: 0,
    };
    // 8 read + 2 written (what is left of the input), none uncached.
    assert_eq!(
        table.get("w").unwrap().cost(clamped),
        Some(usd("0.0000058"))
    );
    // A bad cacheWrite is named.
    let err = PriceTable::from_json(
        r#"{"m": {"input": "1", "cachedInput": "0.1", "cacheWrite": "x", "output": "2"}}"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("cacheWrite"), "{err}");
}

/// Every line of the built-in table is a valid price, and the models the CLIs name today
/// are in it (dated: the table says when it was taken).
#[test]
fn the_builtin_table_covers_current_models() {
    let table = PriceTable::builtin();
    for model in [
        "claude-sonnet-5",
        "claude-haiku-4-5-20251001",
        "claude-opus-4-8",
        "gpt-6.1-sol",
        "gpt-6-luna",
        "gpt-6-astra",
        "gpt-5.6-terra",
        "gpt-5.5",
    ] {
        assert!(table.get(model).is_some(), "{model} has no price");
    }
    assert!(table.models().count() >= 35);
    assert_eq!(agentry_runner::PRICES_AS_OF, "2026-11-25");
}

#[test]
fn price_override_file() {
    let text = r#"{"gpt-5": {"input": "2", "cachedInput": "0.2", "output": "20"},
                   "local-model": {"input": "0", "cachedInput": "0", "output": "0"}}"#;
    let overrides = PriceTable::from_json(text).unwrap();
    let merged = PriceTable::builtin().merged_with(overrides);
    assert_eq!(merged.get("gpt-5").unwrap().output.to_string(), "20");
    assert_eq!(merged.get("local-model").unwrap().input.to_string(), "0");
    assert!(merged.get("gpt-5-mini").is_some());
    let r = parse_codex(
        "{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":1000000,\"cached_input_tokens\":0,\"output_tokens\":0}}",
        "gpt-5",
        &merged,
    );
    assert_eq!(r.cost_usd, Some(usd("2")));
}

#[test]
fn bad_price_files_name_the_entry() {
    let entry_error = |text: &str| match PriceTable::from_json(text) {
        Err(PriceError::Entry { model, reason }) => (model, reason),
        other => panic!("{text}: {other:?}"),
    };
    let (model, reason) = entry_error(
        r#"{"ok": {"input": "1", "cachedInput": "0.1", "output": "2"}, "bad-model": {"input": 1.25, "cachedInput": "0.1", "output": "2"}}"#,
    );
    assert_eq!(model, "bad-model");
    assert!(reason.starts_with("input:"), "{reason}");
    let (model, reason) =
        entry_error(r#"{"m": {"input": "1", "cachedInput": "-0.1", "output": "2"}}"#);
    assert_eq!(model, "m");
    assert!(reason.starts_with("cachedInput:"), "{reason}");
    let (_, reason) = entry_error(r#"{"m": {"input": "1", "cachedInput": "1e-3", "output": "2"}}"#);
    assert!(reason.starts_with("cachedInput:"), "{reason}");
    let (_, reason) = entry_error(r#"{"m": {"input": "1", "cachedInput": "1"}}"#);
    assert_eq!(reason, "output: missing");
    let (_, reason) =
        entry_error(r#"{"m": {"input": "1", "cachedInput": "1", "output": "1", "outptu": "1"}}"#);
    assert!(reason.contains("outptu"), "{reason}");
    let (_, reason) = entry_error(r#"{"m": "1.25"}"#);
    assert!(reason.contains("must be an object"), "{reason}");
    let err = PriceTable::from_json(r#"{"m": {"input": "1", "cachedInput": "1", "output": "x"}}"#)
        .unwrap_err();
    assert!(
        err.to_string().starts_with("price entry \"m\": output:"),
        "{err}"
    );
    assert!(matches!(
        PriceTable::from_json("[]"),
        Err(PriceError::NotAnObject)
    ));
    assert!(matches!(
        PriceTable::from_json("{"),
        Err(PriceError::Json(_))
    ));
}

// ------------------------------------------------------------------ Proptests

const FIXTURES: &[&str] = &[
    "claude_success.jsonl",
    "claude_max_turns.jsonl",
    "claude_max_budget.jsonl",
    "claude_error_during_execution.jsonl",
    "claude_truncated.jsonl",
    "codex_success.jsonl",
    "codex_turn_failed.jsonl",
    "codex_truncated.jsonl",
    "claude_real_success.jsonl",
    "claude_real_max_budget.jsonl",
    "claude_real_api_error.jsonl",
    "claude_real_review_bare_mirror_worktree.jsonl",
    "claude_real_sigint.jsonl",
    "claude_real_max_turns.jsonl",
    "codex_real_exec.jsonl",
    "codex_real_api_error.jsonl",
    "codex_real_sigint.jsonl",
];

/// Applies byte edits (position, new byte or deletion) to `text`, lossily back to UTF-8.
fn mutate(text: &str, edits: &[(usize, Option<u8>)]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for &(pos, byte) in edits {
        if bytes.is_empty() {
            break;
        }
        let pos = pos % bytes.len();
        match byte {
            Some(b) => bytes[pos] = b,
            None => {
                bytes.remove(pos);
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The two parsers (Claude Code, and Codex priced for gpt-5).
fn parsers() -> [OutputParser; 2] {
    [
        OutputParser::claude(),
        OutputParser::codex("gpt-5", &PriceTable::builtin()),
    ]
}

/// `parser` fed `bytes` cut at the positions `cuts` (any order, taken modulo the length + 1).
fn fed_in_pieces(mut parser: OutputParser, bytes: &[u8], cuts: &[usize]) -> RunReport {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.push(bytes.len());
    cuts.sort_unstable();
    let mut start = 0;
    for cut in cuts {
        parser.feed(&bytes[start..cut]);
        start = cut;
    }
    parser.finish()
}

#[test]
fn fixtures_fed_byte_by_byte_give_the_same_report() {
    for name in FIXTURES {
        let text = fixture(name);
        let every_byte: Vec<usize> = (0..text.len()).collect();
        let [claude, codex] = parsers();
        assert_eq!(
            fed_in_pieces(claude, text.as_bytes(), &every_byte),
            parse_claude(&text),
            "{name}"
        );
        assert_eq!(
            fed_in_pieces(codex, text.as_bytes(), &every_byte),
            parse_codex(&text, "gpt-5", &PriceTable::builtin()),
            "{name}"
        );
    }
}

#[test]
fn an_over_long_line_is_skipped_and_the_result_after_it_read() {
    let long = format!(
        "{{\"type\":\"assistant\",\"text\":\"{}\"}}",
        "a".repeat(MAX_LINE_BYTES)
    );
    let text = format!(
        "{long}\n{}",
        r#"{"type":"result","subtype":"success","total_cost_usd":0.000000007,"modelUsage":{}}"#
    );
    let r = parse_claude(&text);
    assert_eq!(r.outcome, AgentOutcome::Success);
    assert_eq!(r.cost_usd, Some(usd("0.000000007")));
    assert_eq!(
        r.warnings,
        vec![format!(
            "line 1: longer than {} bytes, skipped",
            MAX_LINE_BYTES
        )]
    );
}

fn both(text: &str) {
    let _ = parse_claude(text);
    let _ = parse_codex(text, "gpt-5", &PriceTable::builtin());
    let _ = PriceTable::from_json(text);
}

proptest! {
    #[test]
    fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
        both(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn never_panics_on_json_like_lines(lines in proptest::collection::vec(
        r#"\{"type":"(result|system|turn\.completed|turn\.failed|error|item\.completed)"(,"[a-zA-Z_]{1,20}":([0-9eE.+-]{1,12}|"[^"\\]{0,10}"|null|true|\{\}|\[\]))*\}"#,
        0..20,
    )) {
        both(&lines.join("\n"));
    }

    #[test]
    fn never_panics_on_mutated_fixtures(
        index in 0..FIXTURES.len(),
        edits in proptest::collection::vec((any::<usize>(), proptest::option::of(any::<u8>())), 1..20),
    ) {
        both(&mutate(&fixture(FIXTURES[index]), &edits));
    }

    /// Fed in pieces cut anywhere (inside lines, inside characters), each parser gives the
    /// report it gives for the whole text.
    #[test]
    fn pieces_give_the_same_report_as_the_whole(
        index in 0..FIXTURES.len(),
        edits in proptest::collection::vec((any::<usize>(), proptest::option::of(any::<u8>())), 0..4),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let text = mutate(&fixture(FIXTURES[index]), &edits);
        for (whole, pieces) in parsers().into_iter().zip(parsers()) {
            let mut whole = whole;
            whole.feed(text.as_bytes());
            prop_assert_eq!(whole.finish(), fed_in_pieces(pieces, text.as_bytes(), &cuts));
        }
    }

    #[test]
    fn claude_cost_is_exact(int in 0_u32..1000, frac in "[0-9]{1,9}") {
        let text = format!(
            r#"{{"type":"result","subtype":"success","total_cost_usd":{int}.{frac},"modelUsage":{{}}}}"#
        );
        let r = parse_claude(&text);
        prop_assert_eq!(r.cost_usd, Some(usd(&format!("{int}.{frac}"))));
    }
}
