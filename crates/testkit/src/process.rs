//! Processes of this machine, as a test finds them from outside: a run's agent and its
//! children are known by an environment variable (their process ids differ inside a
//! sandbox).

/// Whether process `pid` exists and is not a zombie (a zombie runs nothing; its parent
/// reaps it).
pub fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// The live processes whose environment holds `var` (`NAME=value`) exactly; none where
/// `/proc` cannot be read.
pub fn processes_with_env(var: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            pid_alive(*pid)
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == var.as_bytes()))
        })
        .collect()
}
