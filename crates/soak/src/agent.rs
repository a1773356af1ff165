//! The fake agent the replicas run (`AGENTRY_CLAUDE_BIN`), and its ledger.
//!
//! It prints what `crates/runner/tests/fake-agents/claude` prints on success, as Claude Code
//! 2.1.197 does (a stream-json init event, one assistant event per content block: a text and
//! a Bash tool call, the tool's result, the final assistant text and a `result` event with
//! `total_cost_usd` and `modelUsage`), answers `--version` as that version, with a cost of
//! 0.010000 to 0.500000 USD and a duration drawn from the seed, the task id and the attempt. Before it prints its
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
# The soak's fake `claude`: the output of the real CLI (Claude Code 2.1.197) on success, a
# seeded random cost and duration, and a ledger line (replica task attempt cost start-ms
# end-ms) before the result.
set -u
if [ "${{1:-}}" = --version ]; then
	echo "2.1.197 (Claude Code)"
	exit 0
fi
ledger='{ledger}'
prompt=$(cat)
model=claude-sonnet-4-5-20250929
permission_mode=default
while [ $# -gt 0 ]; do
	case $1 in
	--model) if [ $# -ge 2 ]; then model=$2; shift; fi ;;
	--permission-mode) if [ $# -ge 2 ]; then permission_mode=$2; shift; fi ;;
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
line_json=$(json "$first_line")
done_text="Done: $line_json"
model_json=$(json "$model")
cwd_json=$(json "$PWD")
home_json=$(json "$HOME")
mode_json=$(json "$permission_mode")
project=$(printf '%s' "$PWD" | sed 's/[^A-Za-z0-9]/-/g')
session_id=$(printf '5f1c2a9e-7d3b-4b8a-9c61-%012d' "$$")
if [ -n "${{ANTHROPIC_API_KEY:-}}" ]; then key_source=ANTHROPIC_API_KEY; else key_source=none; fi
call=$(printf 'msg_%08x%016x' 1 "$$")
tool=$(printf 'toolu_%08x%016x' 1 "$$")
printf '{{"type":"system","subtype":"init","cwd":"%s","session_id":"%s","tools":["Task","Bash","CronCreate","CronDelete","CronList","DesignSync","Edit","EnterWorktree","ExitWorktree","NotebookEdit","Read","ReportFindings","ScheduleWakeup","SendMessage","Skill","TaskCreate","TaskGet","TaskList","TaskOutput","TaskStop","TaskUpdate","WebFetch","WebSearch","Workflow","Write"],"mcp_servers":[],"model":"%s","permissionMode":"%s","slash_commands":["deep-research","design-sync","update-config","verify","debug","code-review","simplify","batch","fewer-permission-prompts","loop","claude-api","run","run-skill-generator","clear","compact","config","context","heapdump","init","reload-skills","review","security-review","usage","insights","goal","team-onboarding"],"apiKeySource":"%s","claude_code_version":"2.1.197","output_style":"default","agents":["claude","Explore","general-purpose","Plan","statusline-setup"],"skills":["deep-research","design-sync","update-config","verify","debug","code-review","simplify","batch","fewer-permission-prompts","loop","claude-api","run","run-skill-generator"],"plugins":[],"analytics_disabled":false,"product_feedback_disabled":false,"uuid":"d4c1e2f3-0001-4c7d-8e9f-%012x","memory_paths":{{"auto":"%s/.claude/projects/%s/memory/"}},"fast_mode_state":"off"}}\n' \
	"$cwd_json" "$session_id" "$model_json" "$mode_json" "$key_source" "$$" "$home_json" "$project"
sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
printf '{{"type":"assistant","message":{{"id":"%s","type":"message","role":"assistant","model":"%s","content":[{{"type":"text","text":"I will work on it: %s"}}],"stop_reason":null,"stop_sequence":null,"usage":{{"input_tokens":500,"cache_creation_input_tokens":800,"cache_read_input_tokens":2500,"output_tokens":1}},"context_management":null}},"parent_tool_use_id":null,"session_id":"%s","uuid":"d4c1e2f3-0002-4c7d-8e9f-%012x","request_id":"req_0001%016x"}}\n' \
	"$call" "$model_json" "$line_json" "$session_id" "$$" "$$"
case $first_line in
"Review pull request"*)
	printf '{{"type":"assistant","message":{{"id":"%s","type":"message","role":"assistant","model":"%s","content":[{{"type":"tool_use","id":"%s","name":"Bash","input":{{"command":"git diff --stat","description":"Show what changed"}}}}],"stop_reason":null,"stop_sequence":null,"usage":{{"input_tokens":500,"cache_creation_input_tokens":800,"cache_read_input_tokens":2500,"output_tokens":1}},"context_management":null}},"parent_tool_use_id":null,"session_id":"%s","uuid":"d4c1e2f3-0003-4c7d-8e9f-%012x","request_id":"req_0001%016x"}}\n' \
		"$call" "$model_json" "$tool" "$session_id" "$$" "$$"
	printf '{{"type":"user","message":{{"role":"user","content":[{{"tool_use_id":"%s","type":"tool_result","content":"(Bash completed with no output)","is_error":false}}]}},"parent_tool_use_id":null,"session_id":"%s","uuid":"d4c1e2f3-0004-4c7d-8e9f-%012x","timestamp":"%s","tool_use_result":{{"stdout":"","stderr":"","interrupted":false,"isImage":false,"noOutputExpected":false}}}}\n' \
		"$tool" "$session_id" "$$" "$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)"
	;;
*)
	added=$(printf '%s (task %s)' "$first_line" "$task")
	printf '%s\n' "$added" >>AGENT_CHANGES.md
	quoted=$(printf '%s' "$added" | sed "s/'/'\\\\''/g")
	command=$(json "printf '%s\\n' '$quoted' >> AGENT_CHANGES.md")
	printf '{{"type":"assistant","message":{{"id":"%s","type":"message","role":"assistant","model":"%s","content":[{{"type":"tool_use","id":"%s","name":"Bash","input":{{"command":"%s","description":"Append a line to AGENT_CHANGES.md"}}}}],"stop_reason":null,"stop_sequence":null,"usage":{{"input_tokens":500,"cache_creation_input_tokens":800,"cache_read_input_tokens":2500,"output_tokens":1}},"context_management":null}},"parent_tool_use_id":null,"session_id":"%s","uuid":"d4c1e2f3-0003-4c7d-8e9f-%012x","request_id":"req_0001%016x"}}\n' \
		"$call" "$model_json" "$tool" "$command" "$session_id" "$$" "$$"
	printf '{{"type":"user","message":{{"role":"user","content":[{{"tool_use_id":"%s","type":"tool_result","content":"(Bash completed with no output)","is_error":false}}]}},"parent_tool_use_id":null,"session_id":"%s","uuid":"d4c1e2f3-0004-4c7d-8e9f-%012x","timestamp":"%s","tool_use_result":{{"stdout":"","stderr":"","interrupted":false,"isImage":false,"noOutputExpected":false}}}}\n' \
		"$tool" "$session_id" "$$" "$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)"
	;;
esac
printf '%s %s %s %s %s %s\n' "$replica" "$task" "$attempt" "$cost" "$start" "$(date +%s%3N)" >>"$ledger"
usage='{{"input_tokens":1000,"cache_creation_input_tokens":800,"cache_read_input_tokens":5000,"output_tokens":330,"server_tool_use":{{"web_search_requests":0,"web_fetch_requests":0}},"service_tier":"standard","cache_creation":{{"ephemeral_1h_input_tokens":0,"ephemeral_5m_input_tokens":800}},"inference_geo":"","iterations":[],"speed":"standard"}}'
model_usage=$(printf '{{"%s":{{"inputTokens":1200,"outputTokens":340,"cacheReadInputTokens":5000,"cacheCreationInputTokens":800,"webSearchRequests":0,"costUSD":%s,"contextWindow":200000,"maxOutputTokens":64000}}}}' "$model_json" "$cost")
printf '{{"type":"assistant","message":{{"id":"%s","type":"message","role":"assistant","model":"%s","content":[{{"type":"text","text":"%s"}}],"stop_reason":null,"stop_sequence":null,"usage":{{"input_tokens":500,"cache_creation_input_tokens":0,"cache_read_input_tokens":2500,"output_tokens":1}},"context_management":null}},"parent_tool_use_id":null,"session_id":"%s","uuid":"d4c1e2f3-0005-4c7d-8e9f-%012x","request_id":"req_0002%016x"}}\n' \
	"$(printf 'msg_%08x%016x' 2 "$$")" "$model_json" "$done_text" "$session_id" "$$" "$$"
printf '{{"type":"result","subtype":"success","is_error":false,"api_error_status":null,"duration_ms":%s,"duration_api_ms":%s,"ttft_ms":1012,"ttft_stream_ms":1009,"time_to_request_ms":930,"num_turns":2,"result":"%s","stop_reason":"end_turn","session_id":"%s","total_cost_usd":%s,"usage":%s,"modelUsage":%s,"permission_denials":[],"terminal_reason":"completed","fast_mode_state":"off","uuid":"d4c1e2f3-0006-4c7d-8e9f-%012x"}}\n' \
	"$ms" "$ms" "$done_text" "$session_id" "$cost" "$usage" "$model_usage" "$$"
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
        let events: Vec<serde_json::Value> = stdout
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(events[0]["subtype"], "init");
        assert_eq!(events[0]["claude_code_version"], "2.1.197");
        assert_eq!(last["subtype"], "success");
        assert_eq!(last["num_turns"], 2);
        assert_eq!(last["result"], "Done: Fix the thing");

        // The runner asks the CLI its version before a run: no ledger line for that.
        let version = Command::new("sh")
            .arg(&script_path)
            .arg("--version")
            .env("HOME", dir.join("cli-home"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(version.status.success());
        assert_eq!(
            String::from_utf8_lossy(&version.stdout),
            "2.1.197 (Claude Code)\n"
        );
        let ledger = read_ledger(&std::fs::read_to_string(dir.join("ledger")).unwrap()).unwrap();
        assert_eq!(ledger.values().map(Vec::len).sum::<usize>(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
