//! SQL scripts as tests and benchmarks replay parts of them.

/// The statements of the SQL `script` (split at `;`, with its `--` comment lines left out)
/// whose code starts with `keyword`: for instance a migration's `INSERT` backfill, run
/// again over data a test or benchmark wrote.
pub fn statements_starting_with<'a>(
    script: &'a str,
    keyword: &'a str,
) -> impl Iterator<Item = String> + 'a {
    script
        .split(';')
        .map(|statement| {
            let code = statement
                .lines()
                .filter(|line| !line.trim_start().starts_with("--"));
            code.collect::<Vec<_>>().join("\n")
        })
        .filter(move |code| code.trim_start().starts_with(keyword))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_statements_of_the_keyword_without_comments() {
        let script = "-- the table\nCREATE TABLE t (a INT);\n-- its backfill\n\
                      INSERT INTO t\n  -- every row\n  SELECT 1;\nINSERT INTO t SELECT 2";
        let inserts: Vec<_> = statements_starting_with(script, "INSERT").collect();
        assert_eq!(
            inserts,
            ["\nINSERT INTO t\n  SELECT 1", "\nINSERT INTO t SELECT 2"]
        );
        assert_eq!(statements_starting_with(script, "DROP").count(), 0);
    }
}
