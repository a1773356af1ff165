//! The terminal rendering of the cost report for `agentry costs`: summary cards, the
//! costliest tasks and the anomalies, as aligned text tables. It renders the report's JSON
//! (the same document the API serves), so both always show the same figures.

use agentry_domain::RepoUrl;
use serde_json::Value;

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

/// Left-aligned columns separated by two spaces; numeric-looking columns right-aligned.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
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

/// Renders the report JSON as text.
pub fn render(report: &Value, repo: Option<&RepoUrl>) -> String {
    let s = &report["summary"];
    let f = &report["forecast"];
    let scope = repo.map_or("all repositories".to_owned(), |r| r.to_string());
    let mut out = format!("Costs over the last {} days, {scope}\n\n", text(&s["days"]));
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
            text(&s["totalCost"]),
            text(&s["taskCount"]),
            text(&s["tasksWithCost"]),
            text(&s["avgCost"]),
            text(&s["costTrend"]),
            text(&s["prevPeriodCost"]),
        ]],
    ));
    out.push_str(&format!(
        "\nThis month so far: {} USD; daily average {} USD; forecast for the month {} USD ({} days left).\n",
        text(&f["monthCostSoFar"]),
        text(&f["dailyAvgCost"]),
        text(&f["forecastedMonthTotal"]),
        text(&f["daysRemaining"]),
    ));
    let rows = |key: &str, cols: &[&str], widths: &[usize]| -> Vec<Vec<String>> {
        report[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|item| {
                        cols.iter()
                            .zip(widths)
                            .map(|(c, w)| short(&text(&item[*c]), *w))
                            .collect()
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let top = rows(
        "topTasks",
        &[
            "costUsd",
            "title",
            "repoUrl",
            "taskType",
            "state",
            "modelUsed",
            "inputTokens",
            "outputTokens",
        ],
        &[20, 40, 45, 6, 12, 24, 12, 12],
    );
    out.push_str("\nCostliest tasks\n");
    if top.is_empty() {
        out.push_str("(none)\n");
    } else {
        out.push_str(&table(
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
            &top,
        ));
    }
    let anomalies = rows(
        "anomalies",
        &[
            "costUsd",
            "costRatio",
            "repoAvgCost",
            "title",
            "repoUrl",
            "state",
        ],
        &[20, 10, 14, 40, 45, 12],
    );
    out.push_str("\nAnomalies (at least 3x the average of the repository's other tasks)\n");
    if anomalies.is_empty() {
        out.push_str("(none)\n");
    } else {
        out.push_str(&table(
            &[
                "cost (USD)",
                "ratio",
                "repo avg (USD)",
                "title",
                "repository",
                "state",
            ],
            &anomalies,
        ));
    }
    let suggestions = rows(
        "modelSuggestions",
        &[
            "repoUrl",
            "currentModel",
            "suggestedModel",
            "taskCount",
            "estimatedSavings",
        ],
        &[45, 24, 24, 8, 14],
    );
    if !suggestions.is_empty() {
        out.push_str("\nCheaper models with proven results\n");
        out.push_str(&table(
            &[
                "repository",
                "current",
                "suggested",
                "tasks",
                "savings (USD)",
            ],
            &suggestions,
        ));
    }
    out.push_str(&outcomes(&report["outcomes"]));
    out
}

/// The `outcomes` member: the overall figures, then per repository and per model.
fn outcomes(o: &Value) -> String {
    let mut out = format!(
        "\nCost per outcome (a coding task with its retries and reviews)\n\
         Merged pull requests: {}; cost per merged pull request: {} USD; merged: {} USD; \
         failed or cancelled: {} USD ({}% of the total).\n",
        text(&o["mergedPullRequests"]),
        text(&o["costPerMergedPullRequest"]),
        text(&o["mergedCost"]),
        text(&o["failedCost"]),
        text(&o["failedShare"]),
    );
    let cells = [
        "mergedPullRequests",
        "costPerMergedPullRequest",
        "mergedCost",
        "failedCost",
        "failedShare",
    ];
    let headers = [
        "merged PRs",
        "per merged PR (USD)",
        "merged (USD)",
        "failed (USD)",
        "failed %",
    ];
    for (key, name, title) in [
        ("byRepo", "repoUrl", "repository"),
        ("byModel", "model", "model"),
    ] {
        let rows: Vec<Vec<String>> = o[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|item| {
                        std::iter::once(short(&text(&item[name]), 45))
                            .chain(cells.iter().map(|c| text(&item[*c])))
                            .collect()
                    })
                    .collect()
            })
            .unwrap_or_default();
        if !rows.is_empty() {
            let mut h = vec![title];
            h.extend(headers);
            out.push('\n');
            out.push_str(&table(&h, &rows));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_cards_tables_and_empty_sections() {
        let report = json!({
            "summary": {"totalCost": "12.5000", "taskCount": 3, "tasksWithCost": 2, "avgCost": "6.2500",
                        "costTrend": "-33.3", "prevPeriodCost": "18.7500", "days": 7},
            "forecast": {"monthCostSoFar": "20.0000", "dailyAvgCost": "1.7857", "forecastedMonthTotal": "35.0000", "daysRemaining": 8},
            "topTasks": [{"costUsd": "10.5", "title": "Fix the flaky login test", "repoUrl": "https://github.com/acme/web",
                          "taskType": "coding", "state": "completed", "modelUsed": null, "inputTokens": 100, "outputTokens": 7}],
            "anomalies": [], "modelSuggestions": []
        });
        let out = render(&report, None);
        assert!(out.contains("Costs over the last 7 days, all repositories"));
        assert!(
            out.contains("12.5000")
                && out.contains("-33.3")
                && out.contains("35.0000 USD (8 days left)")
        );
        assert!(
            out.contains("Fix the flaky login test") && out.contains("  -  "),
            "{out}"
        );
        assert!(out.contains("Anomalies") && out.contains("(none)"));
        assert!(!out.contains("Cheaper models"));
    }

    #[test]
    fn renders_the_outcomes() {
        let report = json!({
            "summary": {"totalCost": "4.6000", "taskCount": 3, "tasksWithCost": 2, "avgCost": "2.3000",
                        "costTrend": "0.0", "prevPeriodCost": "0.0000", "days": 30},
            "forecast": {"monthCostSoFar": "4.6000", "dailyAvgCost": "0.1533", "forecastedMonthTotal": "5.0000", "daysRemaining": 3},
            "topTasks": [], "anomalies": [], "modelSuggestions": [],
            "outcomes": {
                "mergedPullRequests": 2, "costPerMergedPullRequest": "0.9000", "mergedCost": "1.8000",
                "failedCost": "1.6000", "failedShare": 34.8,
                "byRepo": [
                    {"repoUrl": "https://github.com/acme/web", "mergedPullRequests": 2,
                     "costPerMergedPullRequest": "0.9000", "mergedCost": "1.8000",
                     "failedCost": "0.1000", "failedShare": 5.3},
                    {"repoUrl": "https://github.com/acme/api", "mergedPullRequests": 0,
                     "costPerMergedPullRequest": null, "mergedCost": "0.0000",
                     "failedCost": "1.5000", "failedShare": 75.0}
                ],
                "byModel": [
                    {"model": "opus", "mergedPullRequests": 2, "costPerMergedPullRequest": "0.9000",
                     "mergedCost": "1.8000", "failedCost": "0.0000", "failedShare": 0.0}
                ]
            }
        });
        let out = render(&report, None);
        assert!(
            out.contains(
                "Merged pull requests: 2; cost per merged pull request: 0.9000 USD; merged: \
                 1.8000 USD; failed or cancelled: 1.6000 USD (34.8% of the total)."
            ),
            "{out}"
        );
        let api = out
            .lines()
            .find(|l| l.starts_with("https://github.com/acme/api"))
            .unwrap();
        let cells: Vec<&str> = api.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "https://github.com/acme/api",
                "0",
                "-",
                "0.0000",
                "1.5000",
                "75.0"
            ]
        );
        assert!(out.lines().any(|l| l.starts_with("model ")), "{out}");
        assert!(out.lines().any(|l| l.starts_with("opus ")), "{out}");
    }
}
