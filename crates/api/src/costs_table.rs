//! The terminal rendering of the cost report for `agentry costs`: summary cards, the
//! costliest tasks, the anomalies, model suggestions, cost per outcome and the budgets, as
//! aligned text tables. It renders the typed report (the value the API serialises), so
//! both always show the same figures.

use agentry_analytics::{CostReport, OutcomeFigures, Outcomes};
use agentry_domain::{RepoUrl, format_decimal};
use rust_decimal::Decimal;

/// Whether `c` must not reach a terminal as it is: a control character (C0, DEL, C1: escape
/// sequences start with ESC or CSI and can retitle, recolour or rewrite the operator's
/// terminal) or a Unicode bidirectional override or isolate (U+202A..U+202E,
/// U+2066..U+2069), which reorders what is shown after it.
pub fn is_unsafe_for_terminal(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every character of [`is_unsafe_for_terminal`] written as a Rust-style escape
/// (`\u{1b}`, `\u{202e}`), so text from issues (titles) cannot act on the terminal.
pub fn escape_for_terminal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if is_unsafe_for_terminal(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// `-` for a missing value.
fn or_dash(v: Option<&str>) -> String {
    v.unwrap_or("-").to_owned()
}

/// Left-aligned columns separated by two spaces; numeric-looking columns right-aligned.
/// Every cell is escaped with [`escape_for_terminal`] first.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| escape_for_terminal(c)).collect())
        .collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let numeric: Vec<bool> = (0..headers.len())
        .map(|i| {
            !rows.is_empty()
                && rows.iter().all(|r| {
                    r[i].chars()
                        .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | ','))
                        && !r[i].is_empty()
                })
        })
        .collect();
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i] - cell.chars().count();
            if i > 0 {
                out.push_str("  ");
            }
            if numeric[i] {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    out.push_str(&line(widths.iter().map(|w| "-".repeat(*w)).collect()));
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

fn short(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let cut: String = s.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// Renders the report as text.
pub fn render(report: &CostReport, repo: Option<&RepoUrl>) -> String {
    let s = &report.summary;
    let f = &report.forecast;
    let scope = repo.map_or("all repositories".to_owned(), |r| {
        escape_for_terminal(r.as_str())
    });
    let mut out = format!("Costs over the last {} days, {scope}\n\n", s.days);
    out.push_str(&table(
        &[
            "total (USD)",
            "tasks",
            "with cost",
            "average (USD)",
            "trend %",
            "previous (USD)",
        ],
        &[vec![
            s.total_cost.clone(),
            s.task_count.to_string(),
            s.tasks_with_cost.to_string(),
            s.avg_cost.clone(),
            s.cost_trend.clone(),
            s.prev_period_cost.clone(),
        ]],
    ));
    out.push_str(&format!(
        "\nThis month so far: {} USD; daily average {} USD; forecast for the month {} USD ({} days left).\n",
        f.month_cost_so_far, f.daily_avg_cost, f.forecasted_month_total, f.days_remaining,
    ));
    out.push_str(&section(
        "Costliest tasks",
        &[
            "cost (USD)",
            "title",
            "repository",
            "type",
            "state",
            "model",
            "input tok",
            "output tok",
        ],
        &report.top_tasks,
        |t| {
            vec![
                short(&t.task.cost_usd.to_string(), 20),
                short(&t.task.title, 40),
                short(&t.task.repo_url, 45),
                t.task.task_type.to_string(),
                t.task.state.to_string(),
                short(&or_dash(t.task.model_used.as_deref()), 24),
                t.input_tokens.to_string(),
                t.output_tokens.to_string(),
            ]
        },
        Some("(none)"),
    ));
    out.push_str(&section(
        "Anomalies (at least 3x the average of the repository's other tasks)",
        &[
            "cost (USD)",
            "ratio",
            "repo avg (USD)",
            "title",
            "repository",
            "state",
        ],
        &report.anomalies,
        |a| {
            vec![
                short(&a.task.cost_usd.to_string(), 20),
                format_decimal(a.cost_ratio, 2),
                format_decimal(a.repo_avg_cost, 4),
                short(&a.task.title, 40),
                short(&a.task.repo_url, 45),
                a.task.state.to_string(),
            ]
        },
        Some("(none)"),
    ));
    out.push_str(&section(
        "Cheaper models with proven results",
        &[
            "repository",
            "current",
            "suggested",
            "tasks",
            "savings (USD)",
        ],
        &report.model_suggestions,
        |m| {
            vec![
                short(&m.repo_url, 45),
                short(&m.current_model, 24),
                short(&m.suggested_model, 24),
                m.task_count.to_string(),
                format_decimal(m.estimated_savings, 4),
            ]
        },
        None,
    ));
    out.push_str(&outcomes(&report.outcomes));
    out.push_str(&budgets(report));
    out
}

/// Revision rounds per merged pull request with its 2 decimals (`1.50`), if any.
fn rounds(v: Option<Decimal>) -> Option<String> {
    v.map(|v| format_decimal(v, 2))
}

/// The `outcomes` member: the overall figures, then per repository and per model.
fn outcomes(o: &Outcomes) -> String {
    let mut out = format!(
        "\nCost per outcome (a coding task with its retries and reviews)\n\
         Merged pull requests: {}; cost per merged pull request: {} USD; merged: {} USD; \
         failed or cancelled: {} USD ({}% of the total).\n\
         Revision runs (answering review feedback): {} USD; revision rounds per merged pull \
         request: {}.\n",
        o.figures.merged_pull_requests,
        or_dash(o.figures.cost_per_merged_pull_request.as_deref()),
        o.figures.merged_cost,
        o.figures.failed_cost,
        format_decimal(o.figures.failed_share, 1),
        o.figures.revision_cost,
        or_dash(rounds(o.figures.avg_revisions_per_merged_pull_request).as_deref()),
    );
    let headers = [
        "merged PRs",
        "per merged PR (USD)",
        "merged (USD)",
        "failed (USD)",
        "failed %",
        "revisions (USD)",
        "rounds per merged PR",
    ];
    // A repository's and a model's outcome carry the same figures.
    let row = |name: &str, f: &OutcomeFigures| {
        vec![
            short(name, 45),
            f.merged_pull_requests.to_string(),
            or_dash(f.cost_per_merged_pull_request.as_deref()),
            f.merged_cost.to_owned(),
            f.failed_cost.to_owned(),
            format_decimal(f.failed_share, 1),
            f.revision_cost.to_owned(),
            or_dash(rounds(f.avg_revisions_per_merged_pull_request).as_deref()),
        ]
    };
    let by_repo: Vec<Vec<String>> = o
        .by_repo
        .iter()
        .map(|r| row(&r.repo_url, &r.figures))
        .collect();
    let by_model: Vec<Vec<String>> = o
        .by_model
        .iter()
        .map(|m| row(&m.model, &m.figures))
        .collect();
    for (title, rows) in [("repository", by_repo), ("model", by_model)] {
        if !rows.is_empty() {
            let mut h = vec![title];
            h.extend(headers);
            out.push('\n');
            out.push_str(&table(&h, &rows));
        }
    }
    out
}

/// The `budgets` member: each monthly budget that is set, with its forecast.
fn budgets(report: &CostReport) -> String {
    section(
        "Monthly budgets (this month)",
        &[
            "budget",
            "budget (USD)",
            "spent (USD)",
            "forecast (USD)",
            "runs out on",
        ],
        &report.budgets,
        |b| {
            vec![
                short(b.repo_url.as_deref().unwrap_or("(instance)"), 45),
                b.monthly_budget_usd.clone(),
                b.month_to_date_usd.clone(),
                b.forecast_usd.clone(),
                b.exhausts_on.map_or("-".to_owned(), |d| d.to_string()),
            ]
        },
        None,
    )
}

/// A titled table of `items`, a `row` each. Without items: the title and `when_empty`
/// (`(none)`), or nothing at all when that is `None`.
fn section<T>(
    title: &str,
    headers: &[&str],
    items: &[T],
    row: impl Fn(&T) -> Vec<String>,
    when_empty: Option<&str>,
) -> String {
    if items.is_empty() {
        return when_empty.map_or(String::new(), |text| format!("\n{title}\n{text}\n"));
    }
    let rows: Vec<Vec<String>> = items.iter().map(row).collect();
    format!("\n{title}\n{}", table(headers, &rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_analytics::budgets::BudgetInput;
    use agentry_analytics::{ReportInputs, TaskFact, Window, report};
    use agentry_domain::{TaskState, TaskType, Usd};
    use time::macros::{date, datetime};
    use uuid::Uuid;

    fn fact(
        id: u128,
        title: &str,
        repo: &str,
        state: TaskState,
        cost: &str,
        parent: Option<u128>,
    ) -> TaskFact {
        TaskFact {
            id: Uuid::from_u128(id),
            title: title.into(),
            repo_url: repo.into(),
            task_type: if parent.is_some() {
                TaskType::Review
            } else {
                TaskType::Coding
            },
            state,
            model_used: None,
            cost: Some(Usd::parse(cost).unwrap()),
            input_tokens: 100,
            output_tokens: 7,
            created_at: datetime!(2026-05-20 12:00 UTC),
            parent_task_id: parent.map(Uuid::from_u128),
            revisions: 0,
            revision_cost: Usd::ZERO,
            imported: false,
        }
    }

    fn report_of(tasks: &[TaskFact], budgets: Vec<BudgetInput>) -> CostReport {
        let window = Window::new(date!(2026 - 05 - 23), 7).unwrap();
        let mut inputs = ReportInputs::from_tasks(window, None, tasks);
        inputs.budgets = budgets;
        report(&inputs)
    }

    #[test]
    fn renders_cards_tables_and_empty_sections() {
        let web = "https://github.com/acme/web";
        let out = render(
            &report_of(
                &[
                    fact(
                        1,
                        "Fix the flaky login test",
                        web,
                        TaskState::Completed,
                        "10.5",
                        None,
                    ),
                    fact(2, "Tidy", web, TaskState::Failed, "2", None),
                ],
                Vec::new(),
            ),
            None,
        );
        assert!(
            out.contains("Costs over the last 7 days, all repositories"),
            "{out}"
        );
        assert!(out.contains("12.5000") && out.contains("6.2500"), "{out}");
        assert!(
            out.contains("Fix the flaky login test") && out.contains("  -  "),
            "{out}"
        );
        assert!(out.contains("Anomalies") && out.contains("(none)"));
        assert!(!out.contains("Cheaper models"));
        assert!(!out.contains("Monthly budgets"));
    }

    #[test]
    fn renders_the_outcomes_and_the_budgets() {
        let (web, api) = ("https://github.com/acme/web", "https://github.com/acme/api");
        let out = render(
            &report_of(
                &[
                    // Merged after one revision round whose run cost 0.4 of its 1.7.
                    TaskFact {
                        revisions: 1,
                        revision_cost: Usd::parse("0.4").unwrap(),
                        ..fact(1, "Merged", web, TaskState::Completed, "1.7", None)
                    },
                    fact(2, "Its review", web, TaskState::Completed, "0.1", Some(1)),
                    fact(3, "Gave up", api, TaskState::Failed, "1.5", None),
                ],
                vec![BudgetInput {
                    repo_url: None,
                    monthly_budget: "10".parse().unwrap(),
                    month_to_date: "3.3".parse().unwrap(),
                }],
            ),
            None,
        );
        assert!(
            out.contains(
                "Merged pull requests: 1; cost per merged pull request: 1.8000 USD; merged: \
                 1.8000 USD; failed or cancelled: 1.5000 USD (45.5% of the total)."
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "Revision runs (answering review feedback): 0.4000 USD; revision rounds per \
                 merged pull request: 1.00."
            ),
            "{out}"
        );
        let cells = |start: &str| -> Vec<String> {
            out.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("{out}"))
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(
            cells(api),
            [api, "0", "-", "0.0000", "1.5000", "100.0", "0.0000", "-"]
        );
        assert_eq!(
            cells(web),
            [
                web, "1", "1.8000", "1.8000", "0.0000", "0.0", "0.4000", "1.00"
            ]
        );
        assert!(out.lines().any(|l| l.starts_with("model ")), "{out}");
        let budget = out
            .lines()
            .find(|l| l.starts_with("(instance)"))
            .unwrap_or_else(|| panic!("{out}"));
        let cells: Vec<&str> = budget.split_whitespace().collect();
        // 3.3 in 23 days of 31: 4.4478 for the month; it lasts the month.
        assert_eq!(cells, ["(instance)", "10.0000", "3.3000", "4.4478", "-"]);
    }

    #[test]
    fn escapes_control_characters_and_bidi_overrides_in_every_cell() {
        assert_eq!(
            escape_for_terminal("a\x1b]0;pwned\x07b\u{202e}c\u{7f}\u{9b}d\u{2066}\té"),
            "a\\u{1b}]0;pwned\\u{7}b\\u{202e}c\\u{7f}\\u{9b}d\\u{2066}\\u{9}é"
        );
        assert_eq!(
            escape_for_terminal("Fix the login — ok"),
            "Fix the login — ok"
        );
        let web = "https://github.com/acme/web";
        let evil = "\x1b]0;pwned\x07 Fix \u{202e}txt.exe";
        let out = render(
            &report_of(
                &[
                    fact(1, evil, web, TaskState::Completed, "30", None),
                    fact(2, "a", web, TaskState::Completed, "1", None),
                    fact(3, "b", web, TaskState::Completed, "1", None),
                ],
                Vec::new(),
            ),
            None,
        );
        assert!(
            !out.chars().any(|c| is_unsafe_for_terminal(c) && c != '\n'),
            "{out:?}"
        );
        assert!(
            out.contains("\\u{1b}]0;pwned\\u{7} Fix \\u{202e}txt.exe"),
            "{out}"
        );
        // Both the costliest tasks and the anomalies show the title, escaped.
        assert_eq!(out.matches("\\u{1b}]0;pwned").count(), 2, "{out}");
    }
}
