//! The fake agent the replicas run (`AGENTRY_CLAUDE_BIN`), and its ledger.
//!
//! It prints what `crates/runner/tests/fake-agents/claude` prints on success (a stream-json
//! init event, an assistant tool call and its result, the final assistant text and a `result`
//! event with `total_cost_usd` and `modelUsage`), with a cost of 0.010000 to 0.500000 USD
//! and a duration drawn from the seed, the task id and the attempt. Before it prints its
//! result it appends one line to the ledger:
//!
//! ```text
//! <replica> <task id> <attempt> <cost> <start ms> <end ms>
//! ```
//!
//! The replica, task and attempt come from `$HOME`, which the local runner sets to
//! `<data dir>/runs/<task id>/<attempt>/home`; the replica is the data directory's name.

use std::collections::BTreeMap;
use std::path::Path;

use rust_decimal::Decimal;

/// The script, with the ledger's absolute path, the seed and the duration range in it.
pub fn script(ledger: &Path, seed: u64, agent_ms: (u64, u64)) -> String {
    let ledger = ledger.display().to_string().replace('\'', "'\\''");
    let (lo, hi) = agent_ms;
    let span = hi.saturating_sub(lo) + 1;
    format!(
        r#"#!/bin/sh
# The soak's fake `claude`: the output of the real CLI on success, a seeded random cost and
# duration, and a ledger line (replica task attempt cost start-ms end-ms) before the result.
set -u
ledger='{ledger}'
prompt=$(cat)
model=claude-sonnet-4-5-20250929
while [ $# -gt 0 ]; do
	case $1 in
	--model) if [ $# -ge 2 ]; then model=$2; shift; fi ;;
	esac
	shift
done
run_dir=$(dirname "$HOME")
attempt=$(basename "$run_dir")
task=$(basename "$(dirname "$run_dir")")
replica=$(basename "$(dirname "$(dirname "$(dirname "$run_dir")")")")
start=$(date +%s%3N)
h=$(printf '%s %s %s' '{seed}' "$task" "$attempt" | cksum | cut -d ' ' -f 1)
micro=$((10000 + h % 490001))
cost=$(printf '0.%06d' "$micro")
ms=$(({lo} + (h / 490001) % {span}))
json() {{
	printf '%s' "$1" | tr -d '\000-\037' | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g'
}}
first_line=$(printf '%s\n' "$prompt" | head -n 1)
done_text="Done: $(json "$first_line")"
model_json=$(json "$model")
cwd_json=$(json "$PWD")
session_id=$(printf '5f1c2a9e-7d3b-4b8a-9c61-%012d' "$$")
printf '{{"type":"system","subtype":"init","cwd":"%s","session_id":"%s","tools":["Bash","Read","Edit","Write"],"mcp_servers":[],"model":"%s","permissionMode":"acceptEdits","slash_commands":[],"apiKeySource":"none","claude_code_version":"2.0.37","output_style":"default","agents":[],"uuid":"0b7e5a1c-3f62-4d1e-8f0a-6c2b9d4e7a10"}}\n' \
	"$cwd_json" "$session_id" "$model_json"
sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
case $first_line in
"Review pull request"*) ;;
*) printf '%s (task %s)\n' "$first_line" "$task" >>AGENT_CHANGES.md ;;
esac
printf '{{"type":"assistant","message":{{"model":"%s","id":"msg_01A2b3C4d5E6f7G8h9I0j1K2","type":"message","role":"assistant","content":[{{"type":"tool_use","id":"toolu_01XyZ","name":"Write","input":{{"file_path":"%s/AGENT_CHANGES.md","content":"%s"}}}}],"stop_reason":null,"stop_sequence":null,"usage":{{"input_tokens":4,"cache_creation_input_tokens":800,"cache_read_input_tokens":2500,"output_tokens":40,"service_tier":"standard"}}}},"parent_tool_use_id":null,"session_id":"%s","uuid":"a1"}}\n' \
	"$model_json" "$cwd_json" "$(json "$first_line")" "$session_id"
printf '{{"type":"user","message":{{"role":"user","content":[{{"tool_use_id":"toolu_01XyZ","type":"tool_result","content":"File written successfully"}}]}},"parent_tool_use_id":null,"session_id":"%s","uuid":"u1"}}\n' \
	"$session_id"
printf '%s %s %s %s %s %s\n' "$replica" "$task" "$attempt" "$cost" "$start" "$(date +%s%3N)" >>"$ledger"
usage='{{"input_tokens":1200,"cache_creation_input_tokens":800,"cache_read_input_tokens":5000,"output_tokens":340,"service_tier":"standard"}}'
model_usage=$(printf '{{"%s":{{"inputTokens":1200,"outputTokens":340,"cacheReadInputTokens":5000,"cacheCreationInputTokens":800,"webSearchRequests":0,"costUSD":%s,"contextWindow":200000}}}}' "$model_json" "$cost")
printf '{{"type":"assistant","message":{{"model":"%s","id":"msg_01Q9w8E7r6T5y4U3i2O1p0","type":"message","role":"assistant","content":[{{"type":"text","text":"%s"}}],"stop_reason":null,"stop_sequence":null,"usage":{{"input_tokens":6,"cache_creation_input_tokens":0,"cache_read_input_tokens":2500,"output_tokens":300,"service_tier":"standard"}}}},"parent_tool_use_id":null,"session_id":"%s","uuid":"a2"}}\n' \
	"$model_json" "$done_text" "$session_id"
printf '{{"type":"result","subtype":"success","is_error":false,"duration_ms":%s,"duration_api_ms":%s,"num_turns":3,"result":"%s","session_id":"%s","total_cost_usd":%s,"usage":%s,"modelUsage":%s,"permission_denials":[],"uuid":"d4c1e2f3-5a6b-4c7d-8e9f-0a1b2c3d4e5f"}}\n' \
	"$ms" "$ms" "$done_text" "$session_id" "$cost" "$usage" "$model_usage"
exit 0
"#
    )
}

/// One ledger line: what one agent process reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The data directory's name (`a` or `b`).
    pub replica: String,
    /// The task id.
    pub task: String,
    /// The attempt.
    pub attempt: i64,
    /// The cost it printed.
    pub cost: Decimal,
    /// When it started (unix ms).
    pub start_ms: u64,
    /// When it wrote the line, just before printing its result (unix ms).
    pub end_ms: u64,
}

/// The ledger by (task, attempt); more than one line for a key is a run started twice.
pub fn read_ledger(text: &str) -> Result<BTreeMap<(String, i64), Vec<Entry>>, String> {
    let mut out: BTreeMap<(String, i64), Vec<Entry>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || format!("ledger line {}: {line:?}", i + 1);
        let f: Vec<&str> = line.split(' ').collect();
        let [replica, task, attempt, cost, start, end] = f.as_slice() else {
            return Err(bad());
        };
        let entry = Entry {
            replica: (*replica).to_owned(),
            task: (*task).to_owned(),
            attempt: attempt.parse().map_err(|_| bad())?,
            cost: cost.parse().map_err(|_| bad())?,
            start_ms: start.parse().map_err(|_| bad())?,
            end_ms: end.parse().map_err(|_| bad())?,
        };
        out.entry((entry.task.clone(), entry.attempt))
            .or_default()
            .push(entry);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// The script runs under `sh`, derives replica/task/attempt from `$HOME`, writes its
    /// ledger line before the result, and prints a result the ledger agrees with.
    #[test]
    fn the_script_reports_what_it_writes_in_the_ledger() {
        let dir = std::env::temp_dir().join(format!("soak-agent-{}", std::process::id()));
        let task = "0b7e5a1c-3f62-4d1e-8f0a-6c2b9d4e7a10";
        let home = dir.join("b/runs").join(task).join("2/home");
        let work = dir.join("wt");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let ledger = dir.join("ledger");
        let script_path = dir.join("claude");
        std::fs::write(&script_path, script(&ledger, 7, (10, 30))).unwrap();
        let mut child = Command::new("sh")
            .arg(&script_path)
            .args(["--model", "sonnet"])
            .current_dir(&work)
            .env("HOME", &home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(b"Fix the thing\n\nbody").unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let stdout = String::from_utf8(out.stdout).unwrap();
        let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(last["type"], "result");
        let ledger = read_ledger(&std::fs::read_to_string(&ledger).unwrap()).unwrap();
        let entries = &ledger[&(task.to_owned(), 2)];
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].replica, "b");
        let printed = stdout.lines().last().unwrap();
        assert!(
            printed.contains(&format!("\"total_cost_usd\":{},", entries[0].cost)),
            "{printed}"
        );
        assert!(entries[0].cost >= Decimal::new(1, 2) && entries[0].cost <= Decimal::new(5, 1));
        assert!(
            std::fs::read_to_string(work.join("AGENT_CHANGES.md"))
                .unwrap()
                .contains(task)
        );
        for line in stdout.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
