// Generated from the API's OpenAPI document (GET /api/openapi.json) by
// tools/gen-api-types.mjs. Do not edit: regenerate (see docs/frontend.md).

/** An agent. */
export type AgentTypeName = "claude-code" | "codex";

/**
 * A task costing at least three times the average of the other costed tasks of its
 * repository in the period.
 */
export type Anomaly = CostedTask & {
  /**
   * The leave-one-out average: the average cost of the repository's other costed tasks
   * in the period (a JSON number).
   */
  repoAvgCost: number;
  /** `costUsd / repoAvgCost` (a JSON number). */
  costRatio: number;
};

/** An issue to assign. Unknown members are ignored. */
export interface AssignIssue {
  /** The issue's number (≥ 1). */
  issueNumber: number;
  /** A connected repository. */
  repoId: string;
  /** The task's title (non-blank). */
  title: string;
  /** The task's prompt (default empty). */
  body?: string;
  agentType?: AgentTypeName | null;
}

/** The task of an assignment. */
export interface AssignedDto {
  /** The issue's task. */
  task: TaskDto;
  /** Whether it was created by this call. */
  created: boolean;
}

/**
 * A budget alert: a monthly budget reached 50 %, 80 % or 100 % (once per budget, month and
 * threshold).
 */
export interface BudgetAlertDto {
  /** The alert's id; also the `Idempotency-Key` of its webhook delivery. */
  id: string;
  /** Which budget: `instance` or `repository`. */
  scope: string;
  /** The repository, for a repository's budget; null for the instance's. */
  repoUrl?: string | null;
  /** The month, `YYYY-MM` (UTC). */
  month: string;
  /** The percentage of the budget reached: 50, 80 or 100. */
  threshold: number;
  /** The month's spend when the alert was recorded, exact decimal USD. */
  spentUsd: string;
  /** The budget when the alert was recorded, exact decimal USD. */
  monthlyBudgetUsd: string;
  /** When it was recorded (RFC 3339 UTC). */
  createdAt: string;
  /**
   * `pending` (to the webhook, retried until it answers 2xx), `delivered`, or `unsent`
   * (recorded while no `AGENTRY_ALERT_WEBHOOK_URL` was set).
   */
  delivery: string;
  /** Failed delivery attempts so far. */
  deliveryAttempts: number;
  /** When the webhook took it (RFC 3339 UTC). */
  deliveredAt?: string | null;
  /** Why the last attempt failed (never the webhook's URL). */
  lastError?: string | null;
}

/** A page of budget alerts, newest first. */
export interface BudgetAlertListDto {
  /** At most `limit` alerts. */
  alerts: Array<BudgetAlertDto>;
  /** Pass as `cursor` for the next page; null on the last page. */
  nextCursor?: string | null;
}

/** The instance-wide monthly budget and its month so far. */
export interface BudgetDto {
  /** The budget for each UTC calendar month, exact decimal USD; null for none. */
  monthlyBudgetUsd?: string | null;
  /** The month the figures are for, `YYYY-MM`. */
  month: string;
  /** Spent by the runs that finished this month, exact decimal USD. */
  monthToDateUsd: string;
  /**
   * Held by the runs in progress, exact decimal USD: a sandboxed run's metered calls so far
   * and its calls in flight (each at its largest cost); an unsandboxed run's whole allowance.
   */
  reservedUsd: string;
  /** What is left this month after the spend and what runs hold; null without a budget. */
  remainingUsd?: string | null;
  /** The month's spend at the current daily average (4 decimals); null without a budget. */
  forecastUsd?: string | null;
  /**
   * The day (`YYYY-MM-DD`, UTC) the budget runs out at that rate; null when it lasts the
   * month, nothing was spent, or there is no budget.
   */
  exhaustsOn?: string | null;
}

/** A monthly budget and its forecast. Money is a decimal string with 4 decimals. */
export interface BudgetForecast {
  /** `instance` or `repository`. */
  scope: string;
  /** The repository of a repository's budget; null for the instance's. */
  repoUrl?: string | null;
  /** The budget for the month. */
  monthlyBudgetUsd: string;
  /** Spent by the runs that finished this month. */
  monthToDateUsd: string;
  /**
   * `monthToDate / daysElapsed × daysInMonth`: the month at the current daily average
   * (today counts as elapsed).
   */
  forecastUsd: string;
  /**
   * The day the budget runs out at the current daily average (today when it is spent
   * already); null when nothing was spent or it lasts the month.
   */
  exhaustsOn?: string | null;
}

/** The costs of a chart entry in the period. */
export interface ChartCost {
  /** Sum of the costs of its costed tasks (a JSON number). */
  totalCost: number;
  /** Its costed tasks. */
  taskCount: number;
}

/** A repository to connect. */
export interface ConnectRepo {
  /** Any accepted form: `https://github.com/org/repo`, `git@github.com:org/repo.git`, … */
  repoUrl: string;
}

/**
 * The cost report of docs/contract.md#4-cost-report: exactly the members listed in
 * docs/contract.md#42-members.
 */
export interface CostReport {
  /** The summary cards. */
  summary: Summary;
  /** The month forecast. */
  forecast: Forecast;
  /** One entry per day of the period, oldest first, zero-filled. */
  dailyCosts: Array<DailyCost>;
  /** Costs per repository, highest first. */
  costByRepo: Array<RepoCost>;
  /** Costs per task type, highest first. */
  costByType: Array<TypeCost>;
  /** Costs per model, highest first. */
  costByModel: Array<ModelCost>;
  /** Tasks costing at least three times the average of their repository's other tasks. */
  anomalies: Array<Anomaly>;
  /** Cheaper models with proven results, per repository and current model. */
  modelSuggestions: Array<ModelSuggestion>;
  /** The ten costliest tasks of the period. */
  topTasks: Array<TopTask>;
  /**
   * Cost per outcome: merged pull requests, their cost, and the money spent on work
   * that ended failed or cancelled.
   */
  outcomes: Outcomes;
  /** Each monthly budget that is set, for the current UTC month whatever the period. */
  budgets: Array<BudgetForecast>;
}

/**
 * A costed task of the period as the report lists it (in anomalies and the costliest
 * tasks).
 */
export interface CostedTask {
  /** The task's id. */
  id: string;
  /** The task's title. */
  title: string;
  /** The task's repository. */
  repoUrl: string;
  /** The task's type. */
  taskType: string;
  /** The task's state. */
  state: string;
  /** The task's exact cost, a plain decimal string. */
  costUsd: string;
  /** The model used, or null. */
  modelUsed?: string | null;
  /** When the task was created, RFC 3339 UTC. */
  createdAt: string;
}

/** A manual coding task. Unknown members are ignored. */
export interface CreateTask {
  /** A connected repository. */
  repoId: string;
  /** The task's title (non-blank, at most 500 characters). */
  title: string;
  /** The instructions for the agent (at most 256 KiB; default empty). */
  prompt?: string;
  agentType?: AgentTypeName | null;
}

/** A token to create. */
export interface CreateToken {
  /** What the token is for (1 to 100 characters). */
  name: string;
  /** `viewer`, `member` or `admin`. */
  role: RoleName;
}

/** A newly created token: the only time the token is shown. */
export type CreatedTokenDto = TokenDto & {
  /** The bearer token. Store it now; only its hash is kept. */
  token: string;
};

/** One day of the period. */
export interface DailyCost {
  /** The UTC day, `YYYY-MM-DD` on the wire. */
  date: string;
  /** Sum of the costs of the day's costed tasks (a JSON number). */
  cost: number;
  /** The day's costed tasks. */
  taskCount: number;
}

/** Connections the egress proxy refused to one destination during one run. */
export interface EgressBlockedDto {
  /** The run's attempt. */
  attempt: number;
  /**
   * The host asked for (a name or an IP literal), or `*` for the row that sums the
   * run's refusals to destinations beyond its first 32.
   */
  host: string;
  /** The port asked for; 0 in the `*` row. */
  port: number;
  /** How many connections were refused. */
  count: number;
  /** The first refusal. */
  firstAt: string;
  /** The last refusal. */
  lastAt: string;
}

/** The body of every error response. */
export interface ErrorBody {
  /** The error. */
  error: ErrorDetail;
}

/** What went wrong. */
export interface ErrorDetail {
  /** Stable machine-readable code, e.g. `invalid_parameter`. */
  code: string;
  /** A sentence for humans; names the offending field for validation errors. */
  message: string;
}

/** One state change. */
export interface EventDto {
  /** State before; null for the creation event. */
  from?: string | null;
  /** State after. */
  to: string;
  /** Why. */
  reason: string;
  /** When. */
  at: string;
  /**
   * `transition` (a state change), or `cost_mismatch` (a metered run whose agent printed
   * a different cost; `from` = `to`, the state at the time).
   */
  kind: string;
}

/** Review feedback that asked for changes on a task's pull request. */
export interface FeedbackDto {
  /**
   * `review` (changes requested), `issue_comment` or `review_comment` (a mention), or
   * `agent_review` (agentry's own review agent).
   */
  source: string;
  /** Its author (a code-host login). */
  author: string;
  /** What it says. */
  body: string;
  /** Its web address. */
  url: string;
  /** The file of a review comment. */
  path?: string | null;
  /** The line of a review comment. */
  line?: number | null;
  /** When agentry received it. */
  receivedAt: string;
  /** The attempt that started the revision round that took it; null when none did. */
  roundAttempt?: number | null;
  /**
   * `waiting` (for the next round), `taken`, `over_limit` (maxRevisions reached) or
   * `dropped` (the pull request closed first).
   */
  outcome: string;
}

/** The month forecast. Money is a decimal string with exactly 4 decimals. */
export interface Forecast {
  /** `totalCost / days` (idle days count as zero). */
  dailyAvgCost: string;
  /**
   * Costs of the tasks created in the current UTC month (repository filter applies, `days`
   * does not).
   */
  monthCostSoFar: string;
  /**
   * The part of `monthCostSoFar` that is imported history (tasks of `agentry import`,
   * docs/contract.md#39-import), which no budget counts.
   */
  monthImportedCostSoFar: string;
  /**
   * `monthCostSoFar + (totalCost / days) × daysRemaining`, from the exact quotient, rounded
   * once.
   */
  forecastedMonthTotal: string;
  /** Days of the current UTC month after today (0 on its last day). */
  daysRemaining: number;
}

/** Result of an import. */
export interface ImportResultDto {
  /** Records written. */
  imported: number;
  /** Records skipped because their id already existed. */
  skipped: number;
}

/** An open issue of a connected repository, from the synced copy. */
export interface IssueDto {
  /** The repository. */
  repoId: string;
  /** Its normalised URL. */
  repoUrl: string;
  /** Issue number. */
  number: number;
  /** Title. */
  title: string;
  /** Body (empty when the issue has none). */
  body: string;
  /** The issue's page on the code host. */
  htmlUrl: string;
  /** The author's login. */
  author: string;
  /** Current labels. */
  labels: Array<LabelDto>;
  /** Creation time on the code host. */
  createdAt: string;
  /** Last update on the code host. */
  updatedAt: string;
  task?: LinkedTaskDto | null;
}

/** One page of the issues view. */
export interface IssueListDto {
  /**
   * Open issues: unassigned first, then most recently updated, then by repository URL
   * and number; at most `limit`.
   */
  issues: Array<IssueDto>;
  /** Pass as `cursor` for the next page; null on the last page. */
  nextCursor?: string | null;
  /** When each repository was last synced successfully (repository id → time). */
  syncedAt: Record<string, unknown>;
  /** Repositories whose last sync failed. */
  errors: Array<SyncErrorDto>;
}

/** The issue a task is linked to. */
export interface IssueRefDto {
  /** Issue number. */
  number: number;
  /** Its page on the code host. */
  htmlUrl: string;
}

/** A label on an issue. */
export interface LabelDto {
  /** Name. */
  name: string;
  /** Colour, six hex digits. */
  color: string;
}

/** The task linked to an issue. */
export interface LinkedTaskDto {
  /** Task id. */
  id: string;
  /** Its state. */
  state: string;
  /** Its pull request, once opened. */
  prUrl?: string | null;
}

/** The calling token (never the token itself). */
export interface MeDto {
  /** The token's name. */
  name: string;
  /** `viewer`, `member` or `admin`. */
  role: RoleName;
}

/** One model call of a run, as the model gateway metered it. */
export interface ModelCallDto {
  /** Call id. */
  id: string;
  /** The run's attempt. */
  attempt: number;
  /** When the gateway received it. */
  at: string;
  /** `anthropic` or `openai`. */
  provider: string;
  /** The model that answered (else the one asked for). */
  model?: string | null;
  /** The HTTP status the agent got. */
  status: number;
  /**
   * `completed`, `refused` (by the gateway: `budget reached`), `upstream_error` (the
   * provider answered an error, or could not be reached), `interrupted` (the call broke off
   * before its usage came: the answer, the agent or the run ended) or `unmetered` (the
   * answer ended without its usage); the last two cost at least their reservation.
   */
  outcome: string;
  /** Uncached input tokens. */
  inputTokens: number;
  /** Input tokens read from the prompt cache. */
  cacheReadTokens: number;
  /** Input tokens written to the prompt cache. */
  cacheWriteTokens: number;
  /** Output tokens (reasoning included). */
  outputTokens: number;
  /** The part of the output spent on reasoning. */
  reasoningTokens: number;
  /**
   * Its priced cost, exact decimal USD; null only for a call recorded before the gateway
   * refused models without a price.
   */
  costUsd?: string | null;
  /** Until its answer ended, in milliseconds. */
  durationMs: number;
}

/** The metered model calls of a task. */
export interface ModelCallListDto {
  /** Oldest first, by attempt (at most 10,000). */
  calls: Array<ModelCallDto>;
  /** Their summed cost, exact decimal USD; null when one of them has no price. */
  totalCostUsd?: string | null;
}

/** Costs of one model in the period (all task types). */
export type ModelCost = ChartCost & {
  /** The model as stored, or `"unknown"`. */
  model: string;
  /**
   * Percent of its costed tasks in `pr_opened` or `completed`, rounded half away from
   * zero to 1 decimal (a JSON number).
   */
  successRate: number;
  /** `totalCost / taskCount` (a JSON number). */
  avgCost: number;
  /** Input tokens of its costed tasks. */
  totalInputTokens: number;
  /** Output tokens of its costed tasks. */
  totalOutputTokens: number;
};

/**
 * Cost per outcome of one model (the model of the units' coding tasks). `failedShare` is a
 * percent of the spend on the units of that model.
 */
export type ModelOutcome = OutcomeFigures & {
  /** The coding task's model, or `"unknown"`. */
  model: string;
};

/** A cheaper model with proven results for a repository's current coding model. */
export interface ModelSuggestion {
  /** The repository. */
  repoUrl: string;
  /** The model its coding tasks use. */
  currentModel: string;
  /** The costed coding tasks of this repository and model in the period. */
  taskCount: number;
  /** Their average cost (a JSON number). */
  avgCost: number;
  /**
   * The suggested model's average cost over the coding tasks of all repositories (a JSON
   * number).
   */
  cheaperModelAvgCost: number;
  /** The suggested model. */
  suggestedModel: string;
  /** `taskCount × (avgCost − cheaperModelAvgCost)` (a JSON number). */
  estimatedSavings: number;
}

/**
 * The figures of a group of outcome units: the whole period (`failedShare` a percent of
 * `summary.totalCost`), one repository or one model (a percent of the group's spend on its
 * units).
 */
export interface OutcomeFigures {
  /** Pull requests merged: coding tasks of the period in `completed`. */
  mergedPullRequests: number;
  /** `mergedCost / mergedPullRequests`; null when nothing was merged. */
  costPerMergedPullRequest?: string | null;
  /**
   * Everything the merged units cost: every run of their coding tasks (retries and
   * failed attempts included) and of their review subtasks.
   */
  mergedCost: string;
  /** Everything the units that ended `failed` or `cancelled` cost. */
  failedCost: string;
  /**
   * `failedCost` as a percent of the group's spend (of `summary.totalCost` for the whole
   * period), 1 decimal (a JSON number); 0 when nothing was spent.
   */
  failedShare: number;
  /**
   * What the revision runs of the units cost (runs answering review feedback on their
   * pull requests, docs/contract.md#57-revisions), whatever the units' outcome. Part of
   * `mergedCost`, `failedCost` and the open units' spend, not in addition to them.
   */
  revisionCost: string;
  /**
   * The revision rounds of the merged units divided by `mergedPullRequests`, 2 decimals
   * (a JSON number); null when nothing was merged.
   */
  avgRevisionsPerMergedPullRequest?: number | null;
}

/**
 * Cost per outcome over the period (docs/contract.md#42-members, docs/analytics.md).
 *
 * An outcome unit is a coding task with its review subtasks; it belongs to the creation
 * day, repository and model of its coding task and ends as that task does. Money strings
 * have exactly 4 decimals, rounded half away from zero once from the exact value.
 */
export type Outcomes = OutcomeFigures & {
  /** The same figures per repository, highest spend first. */
  byRepo: Array<RepoOutcome>;
  /**
   * The same figures per model of the coding task (`"unknown"` when null), highest spend
   * first.
   */
  byModel: Array<ModelOutcome>;
};

/** A new instance-wide budget. */
export interface PutBudget {
  /**
   * A decimal string of at least 0 with at most 9 decimals (e.g. `"500.00"`), or null to
   * remove the budget.
   */
  monthlyBudgetUsd: string | null;
}

/** A secret's new value. */
export interface PutSecret {
  /** The value (1 to 16 KiB, not blank). Never returned. */
  value: string;
}

/** Costs of one repository in the period. */
export type RepoCost = ChartCost & {
  /** The normalised repository URL. */
  repoUrl: string;
};

/** A repository known to the service. */
export interface RepoDto {
  /** Repository id. */
  id: string;
  /** Normalised URL. */
  repoUrl: string;
  /** Owner (lower case). */
  owner: string;
  /** Name (lower case). */
  name: string;
  /** The default branch on the code host. */
  defaultBranch: string;
  /** The clone URL the code host reports. */
  cloneUrl: string;
  /** Agent settings (docs/contract.md#35-repository-settings). */
  settings: RepoSettingsDto;
  /** When it was (last) connected. */
  connectedAt: string;
  /** When it was disconnected; null while connected. */
  disconnectedAt?: string | null;
  /** First connection. */
  createdAt: string;
  /** Last change. */
  updatedAt: string;
  budget?: BudgetForecast | null;
}

/** The connected repositories. */
export interface RepoListDto {
  /** By URL. */
  repos: Array<RepoDto>;
}

/**
 * Cost per outcome of one repository. `failedShare` is a percent of the repository's
 * spend on the units of the period.
 */
export type RepoOutcome = OutcomeFigures & {
  /** The normalised repository URL. */
  repoUrl: string;
};

/**
 * A repository's agent settings (docs/contract.md#35-repository-settings): every member,
 * always present. `PATCH /api/repos/{id}/settings` takes any subset of the same members.
 */
export interface RepoSettingsDto {
  /** The model of coding tasks (1 to 100 of `A-Za-z0-9._:/-`, not starting with `-`). */
  codingModel: string;
  /** The model of review tasks (same rule as `codingModel`). */
  reviewModel: string;
  /** The agent's turn limit of coding tasks, 1 to 1000; null for the agent's own limit. */
  maxTurnsCoding: number | null;
  /** The agent's turn limit of review tasks, 1 to 1000. */
  maxTurnsReview: number;
  /** The agent of assigned issues and of tasks created without one. */
  agentType: AgentTypeName;
  /** Whether a review task is queued for each pull request a coding task opens. */
  autoReview: boolean;
  /** The most one task may cost, a decimal string greater than 0; null for no cap. */
  maxCostPerTaskUsd: string | null;
  /**
   * What this repository's runs may spend per UTC calendar month, a decimal string of at
   * least 0; null for no budget.
   */
  monthlyBudgetUsd: string | null;
  /**
   * Hosts (names, addresses or `*.` wildcards, in normal form) the repository's sandboxed
   * agents may reach through the egress proxy, besides the instance's; at most 100.
   */
  egressAllow: Array<string>;
  /** How many revision rounds review feedback may start on one pull request, 0 (off) to 50. */
  maxRevisions: number;
  /** Whether the findings of agentry's own review agent start a revision round. */
  reviseOnAgentReview: boolean;
  /**
   * Whether the model gateway passes on calls that ask the provider to reach out on the
   * agent's behalf (MCP servers, server-side web fetch and search, code execution, …).
   * Off by default: such calls reach hosts from the provider's servers, past the egress
   * allow-list (docs/security.md).
   */
  allowProviderTools: boolean;
}

/** A token's role. */
export type RoleName = "viewer" | "member" | "admin";

/** One agent run of a task. */
export interface RunDto {
  /** Run id. */
  id: string;
  /** The task's attempt during this run. */
  attempt: number;
  /** The agent. */
  agentType: string;
  /** The model. */
  model?: string | null;
  /** Exact decimal USD, or null when the agent reported no cost. */
  costUsd?: string | null;
  /** Uncached input tokens. */
  inputTokens: number;
  /** Input tokens read from the prompt cache. */
  cacheReadTokens: number;
  /** Input tokens written to the prompt cache. */
  cacheWriteTokens: number;
  /** Output tokens. */
  outputTokens: number;
  /** Agent turns. */
  turns?: number | null;
  /** `succeeded`, `failed`, `cancelled`, `timed_out` or `lost`. */
  outcome: string;
  /** The agent process's exit code. */
  exitCode?: number | null;
  /** What went wrong. */
  errorMessage?: string | null;
  /** Start. */
  startedAt: string;
  /** End. */
  finishedAt?: string | null;
  /**
   * Whether the agent ran in the sandbox: `false` for runs of a service started with
   * `AGENTRY_AGENT_SANDBOX=off`, null when not known (a run recovered after its service
   * died, or recorded before this was kept).
   */
  sandboxed?: boolean | null;
  /**
   * How many model calls the model gateway metered for this run; null for a run whose
   * calls did not go through the gateway (unsandboxed), whose `costUsd` is then the
   * agent's own word.
   */
  modelCalls?: number | null;
  /**
   * The sum of the run's metered calls (exact decimal USD): for a metered run, the same
   * as `costUsd`; null for a run that was not metered or whose calls include an unpriced
   * model.
   */
  meteredCostUsd?: string | null;
  /**
   * What the agent itself printed as its cost (exact decimal USD), kept beside the
   * metered cost; null when it printed none.
   */
  reportedCostUsd?: string | null;
  /**
   * Why the run happened: `assignment` (the first attempt), `retry` (a retry or a
   * recovery) or `revision` (review feedback; docs/contract.md#57-revisions).
   */
  trigger: string;
  /** For a revision: the web address of the feedback that started its round. */
  triggerUrl?: string | null;
  /** For a revision: that feedback's author (a code-host login). */
  triggerAuthor?: string | null;
}

/** A stored secret (never its value). */
export interface SecretDto {
  /** Name, e.g. `CODEHOST_TOKEN`. */
  name: string;
  /** When it was first stored. */
  createdAt: string;
  /** When its value last changed. */
  updatedAt: string;
}

/** The stored secrets. */
export interface SecretListDto {
  /** By name. */
  secrets: Array<SecretDto>;
}

/** Health status. */
export interface Status {
  /** `ok` or `ready`. */
  status: string;
}

/**
 * The summary cards. Money is a decimal string with exactly 4 decimals, rounded half away
 * from zero once from the exact value.
 */
export interface Summary {
  /** Sum of the costs of the costed tasks of the period. */
  totalCost: string;
  /** All tasks created in the period, costed or not. */
  taskCount: number;
  /** Costed tasks of the period. */
  tasksWithCost: number;
  /** `totalCost / tasksWithCost`; `"0.0000"` when no task is costed. */
  avgCost: string;
  /**
   * `(total − prev) / prev × 100` with 1 decimal (`"25.0"`, `"-33.3"`); `"0.0"` when the
   * previous period cost nothing.
   */
  costTrend: string;
  /** The same sum as `totalCost` over the previous period. */
  prevPeriodCost: string;
  /** The number of days of the period. */
  days: number;
}

/** A repository whose last sync failed. */
export interface SyncErrorDto {
  /** The repository. */
  repoId: string;
  /** Why its last sync failed. */
  message: string;
}

/** A task with everything a dashboard row opens: runs, state history, issue and reviews. */
export type TaskDetailDto = TaskDto & {
  /** Its agent runs, oldest first. */
  runs: Array<RunDto>;
  /** Its state history, oldest first. */
  events: Array<EventDto>;
  issue?: IssueRefDto | null;
  /** Its review subtasks (without their prompts). */
  reviews: Array<TaskSummaryDto>;
  /** The connections its runs' egress proxy refused, by destination. */
  egressBlocked: Array<EgressBlockedDto>;
  /**
   * The review feedback that asked for changes on its pull request, oldest first, with
   * the round that took each (docs/contract.md#57-revisions).
   */
  feedback: Array<FeedbackDto>;
};

/** A task (docs/contract.md#21-task) with its prompt. */
export type TaskDto = TaskSummaryDto & {
  /** The prompt given to the agent (up to 256 KiB). */
  prompt: string;
};

/** One page of tasks. */
export interface TaskListDto {
  /** Tasks, newest first (without their prompts). */
  tasks: Array<TaskSummaryDto>;
  /** Pass as `cursor` for the next page; null on the last page. */
  nextCursor?: string | null;
}

/** A task state. */
export type TaskStateName = "queued" | "provisioning" | "running" | "pr_opened" | "completed" | "failed" | "cancelled";

/**
 * A task (docs/contract.md#21-task) without its prompt, as lists show it: a page of 200 tasks stays small
 * whatever their prompts (`GET /api/tasks/{id}` has the prompt).
 */
export interface TaskSummaryDto {
  /** Task id. */
  id: string;
  /** Title (the issue title for issue tasks). */
  title: string;
  /** The repository; null only for imported history of a repository not connected. */
  repoId?: string | null;
  /** Normalised repository URL. */
  repoUrl: string;
  /** `coding` or `review`. */
  taskType: string;
  /** `queued`, `provisioning`, `running`, `pr_opened`, `completed`, `failed` or `cancelled`. */
  state: string;
  /** `claude-code` or `codex`. */
  agentType: string;
  /** The model the agent reported (or was launched with). */
  modelUsed?: string | null;
  /** Sum of the costs of the task's runs, exact decimal USD; null until a run reports one. */
  costUsd?: string | null;
  /** Input tokens over all runs (cache reads and writes included). */
  inputTokens: number;
  /** Output tokens over all runs. */
  outputTokens: number;
  /** The pull request opened for the task. */
  prUrl?: string | null;
  /** Its number. */
  prNumber?: number | null;
  /** The linked issue's number. */
  issueNumber?: number | null;
  /** The coding task a review task reviews. */
  parentTaskId?: string | null;
  /** 1 for the first run, +1 per retry or recovery. */
  attempt: number;
  /** Why the task failed. */
  errorMessage?: string | null;
  /** Creation time (RFC 3339 UTC). */
  createdAt: string;
  /** Last change. */
  updatedAt: string;
  /** When the latest attempt started. */
  startedAt?: string | null;
  /** When the task finished. */
  finishedAt?: string | null;
  /**
   * Why a queued task is not being started: `budget_exhausted` while a monthly budget
   * has nothing left (docs/contract.md#67-budgets); null otherwise.
   */
  blockedReason?: string | null;
  /** The budget that blocks it: `repository` or `instance`; null when not blocked. */
  blockedBy?: string | null;
  /**
   * History brought in by an import (docs/contract.md#39-import): never run here, and a
   * retry of it is refused.
   */
  imported: boolean;
  /**
   * How many revision rounds review feedback started on the task's pull request
   * (docs/contract.md#57-revisions).
   */
  revisions: number;
}

/** A task type. */
export type TaskTypeName = "coding" | "review";

/** A stored token (never the token itself). */
export interface TokenDto {
  /** Token id. */
  id: string;
  /** Name. */
  name: string;
  /** Role. */
  role: string;
  /** Creation time. */
  createdAt: string;
}

/** The list of active tokens. */
export interface TokenListDto {
  /** Active tokens, oldest first. */
  tokens: Array<TokenDto>;
}

/** One of the costliest tasks of the period. */
export type TopTask = CostedTask & {
  /** The task's input tokens. */
  inputTokens: number;
  /** The task's output tokens. */
  outputTokens: number;
};

/** Costs of one task type in the period. */
export type TypeCost = ChartCost & {
  /** `coding` or `review`. */
  taskType: string;
};

/** The answer to a delivery. */
export interface WebhookAck {
  /** Always true: the delivery was accepted. */
  ok: boolean;
  /** Present and true when agentry does not act on this event. */
  ignored?: boolean;
  /** Present and true for a delivery id seen before (nothing done again). */
  duplicate?: boolean;
}
