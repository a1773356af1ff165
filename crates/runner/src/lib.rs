//! agentry's agent runner: claiming queued tasks, git workspaces, the Claude Code and Codex
//! adapters with exact cost capture, and process control. Built by the agent-run capability;
//! this crate has no code yet, and nothing in the workspace depends on it.
