// @ts-check
/**
 * /tasks/{id}: a task's fields, state history, runs (each with why it ran), pull request,
 * review subtasks, the revision rounds review feedback started, and the tail of its agent
 * output (refreshed while it runs), with Cancel and Retry for members (no Retry for imported
 * history, which the API refuses).
 */
import { api, apiText, ApiError, can } from './api.js';
import { fill, h, region, tablePanel } from './dom.js';
import { count, moneyEl, repoName, stateBadge, stateLabel, time } from './format.js';

/** @typedef {import('../types/api').TaskDetailDto} TaskDetailDto */
/** @typedef {import('../types/api').TaskDto} TaskDto */
/** @typedef {import('../types/api').EgressBlockedDto} EgressBlockedDto */

const LIVE = ['queued', 'provisioning', 'running'];
const TAIL_LINES = 200;
const REFRESH_MS = 3000;

/**
 * A definition list from pairs (values left out when null).
 * @param {Array<[string, Node | string | null | undefined]>} pairs
 */
function fields(pairs) {
  const dl = h('dl', { class: 'fields' });
  for (const [name, value] of pairs) {
    if (value === null || value === undefined) continue;
    dl.append(h('dt', {}, name), h('dd', {}, value));
  }
  return dl;
}

/** @param {TaskDetailDto} t */
function overview(t) {
  return fields([
    ['State', stateBadge(t.state)],
    ['Repository', repoName(t.repoUrl)],
    ['Task type', t.taskType],
    ['Agent', t.agentType],
    ['Model', t.modelUsed ?? '–'],
    ['Cost', moneyEl(t.costUsd ?? null)],
    ['Input tokens', count(t.inputTokens)],
    ['Output tokens', count(t.outputTokens)],
    ['Attempt', String(t.attempt)],
    ['Revisions', t.revisions > 0 ? String(t.revisions) : null],
    ['Origin', t.imported ? 'Imported history: it is not run here and cannot be retried' : null],
    ['Issue', t.issue ? h('a', { href: t.issue.htmlUrl, rel: 'noopener noreferrer' }, `#${t.issue.number}`) : null],
    ['Pull request', t.prUrl ? h('a', { href: t.prUrl, rel: 'noopener noreferrer' }, t.prNumber ? `#${t.prNumber}` : t.prUrl) : null],
    ['Parent task', t.parentTaskId ? h('a', { href: `/tasks/${t.parentTaskId}` }, 'the coding task') : null],
    ['Error', t.errorMessage ?? null],
    ['Created', time(t.createdAt)],
    ['Started', t.startedAt ? time(t.startedAt) : null],
    ['Finished', t.finishedAt ? time(t.finishedAt) : null],
    ['Updated', time(t.updatedAt)],
  ]);
}

/** @param {TaskDetailDto} t */
function history(t) {
  return region(
    'State history',
    { class: 'panel' },
    h(
      'ol',
      { class: 'events' },
      ...t.events.map((e) =>
        e.kind === 'cost_mismatch'
          ? h('li', { class: 'warn' }, time(e.at), ' ', h('strong', {}, 'Cost mismatch'), ` (${e.reason})`)
          : h('li', {}, time(e.at), ' ', e.from ? `${stateLabel(e.from)} → ` : '', h('strong', {}, stateLabel(e.to)), e.reason ? ` (${e.reason})` : ''),
      ),
    ),
  );
}

/** @param {TaskDetailDto} t */
function runs(t) {
  const head = ['Attempt', 'Why', 'Started', 'Outcome', 'Model', 'Input tokens', 'Output tokens', 'Turns', 'Model calls', 'Cost'];
  const numeric = [true, false, false, false, false, true, true, true, true, true];
  const rows = t.runs.map((r) =>
    h(
      'tr',
      {},
      h('td', { class: 'num' }, String(r.attempt)),
      h('td', {}, why(r)),
      h('td', {}, time(r.startedAt)),
      h('td', {}, r.outcome, r.errorMessage ? h('span', { class: 'note' }, `: ${r.errorMessage}`) : null, r.sandboxed === false ? h('span', { class: 'note' }, ' (unsandboxed)') : null),
      h('td', {}, r.model ?? '–'),
      h('td', { class: 'num' }, count(r.inputTokens)),
      h('td', { class: 'num' }, count(r.outputTokens)),
      h('td', { class: 'num' }, r.turns === null || r.turns === undefined ? '–' : String(r.turns)),
      h('td', { class: 'num' }, r.modelCalls === null || r.modelCalls === undefined ? '–' : count(r.modelCalls)),
      h(
        'td',
        { class: 'num' },
        moneyEl(r.costUsd ?? null),
        r.modelCalls !== null && r.modelCalls !== undefined
          ? h('span', { class: 'note' }, ' metered', r.reportedCostUsd ? h('span', {}, '; agent said ', moneyEl(r.reportedCostUsd)) : '')
          : null,
      ),
    ),
  );
  return tablePanel('Runs', head, numeric, rows, 'No runs yet.');
}

/**
 * Why a run happened: its first run, a retry (or a recovery), or a revision with the
 * feedback that started its round.
 * @param {TaskDetailDto['runs'][number]} r
 */
function why(r) {
  if (r.trigger === 'revision') {
    const who = r.triggerAuthor ? ` for @${r.triggerAuthor}` : '';
    return r.triggerUrl ? h('a', { href: r.triggerUrl, rel: 'noopener noreferrer' }, `revision${who}`) : `revision${who}`;
  }
  return r.trigger === 'retry' ? 'retry' : 'first run';
}

const SOURCES = {
  review: 'changes requested',
  issue_comment: 'comment',
  review_comment: 'comment on the diff',
  agent_review: 'agentry’s review',
};

/**
 * One piece of feedback: who, what kind (with file and line), a link, and its text.
 * @param {TaskDetailDto['feedback'][number]} f
 */
function feedbackItem(f) {
  const kind = SOURCES[/** @type {keyof typeof SOURCES} */ (f.source)] ?? f.source;
  const where = f.path ? ` on ${f.path}${f.line ? `:${f.line}` : ''}` : '';
  return h(
    'li',
    {},
    h('a', { href: f.url, rel: 'noopener noreferrer' }, `@${f.author}`),
    ` (${kind}${where}, ${time(f.receivedAt)})`,
    h('blockquote', {}, f.body.length > 400 ? `${f.body.slice(0, 400)}…` : f.body),
  );
}

/**
 * The revision rounds: the feedback each round took (by the attempt that started it), and
 * what waits or was not acted on.
 * @param {TaskDetailDto} t
 */
function rounds(t) {
  if (!t.feedback || t.feedback.length === 0) return null;
  /** @type {Map<number, TaskDetailDto['feedback']>} */
  const taken = new Map();
  const waiting = [];
  const over = [];
  const dropped = [];
  for (const f of t.feedback) {
    if (f.outcome === 'taken' && f.roundAttempt !== null && f.roundAttempt !== undefined) {
      taken.set(f.roundAttempt, [...(taken.get(f.roundAttempt) ?? []), f]);
    } else if (f.outcome === 'waiting') waiting.push(f);
    else if (f.outcome === 'over_limit') over.push(f);
    else dropped.push(f);
  }
  const parts = [];
  let n = 0;
  for (const [attempt, items] of [...taken.entries()].sort((a, b) => a[0] - b[0])) {
    n += 1;
    parts.push(
      h('h3', {}, `Round ${n} (attempt ${attempt})`),
      h('ul', { class: 'feedback' }, ...items.map(feedbackItem)),
    );
  }
  if (waiting.length) parts.push(h('h3', {}, 'Waiting for the next round'), h('ul', { class: 'feedback' }, ...waiting.map(feedbackItem)));
  if (over.length) parts.push(h('h3', {}, 'Past the repository’s revision limit (not acted on)'), h('ul', { class: 'feedback' }, ...over.map(feedbackItem)));
  if (dropped.length) parts.push(h('h3', {}, 'Left when the pull request closed'), h('ul', { class: 'feedback' }, ...dropped.map(feedbackItem)));
  return region('Revision rounds', { class: 'panel wide' }, ...parts);
}

/**
 * Where a refused connection went: host:port ([v6]:port), or the run's row of other destinations.
 * @param {EgressBlockedDto} b
 */
function destination(b) {
  if (b.host === '*') return 'other destinations';
  return b.host.includes(':') ? `[${b.host}]:${b.port}` : `${b.host}:${b.port}`;
}

/** @param {TaskDetailDto} t */
function egress(t) {
  if (!t.egressBlocked || t.egressBlocked.length === 0) return null;
  const head = ['Attempt', 'Destination', 'Refused', 'First', 'Last'];
  return region(
    'Blocked connections',
    { class: 'panel wide' },
    h('p', { class: 'note' }, 'The agent tried to reach these hosts and ports; they are not in the repository’s egressAllow (a member without a port allows 443 only), or resolve to a private address. Each run lists its first 32 destinations; “other destinations” sums the rest.'),
    h(
      'div',
      { class: 'table-wrap' },
      h(
        'table',
        {},
        h('thead', {}, h('tr', {}, ...head.map((c) => h('th', { scope: 'col' }, c)))),
        h(
          'tbody',
          {},
          ...t.egressBlocked.map((b) =>
            h(
              'tr',
              {},
              h('td', { class: 'num' }, String(b.attempt)),
              h('td', {}, destination(b)),
              h('td', { class: 'num' }, count(b.count)),
              h('td', {}, time(b.firstAt)),
              h('td', {}, time(b.lastAt)),
            ),
          ),
        ),
      ),
    ),
  );
}

/** @param {TaskDetailDto} t */
function reviews(t) {
  if (t.taskType === 'review') return null;
  return region(
    'Review subtasks',
    { class: 'panel' },
    t.reviews.length === 0
      ? h('p', { class: 'state' }, 'No review subtasks.')
      : h('ul', {}, ...t.reviews.map((r) => h('li', {}, h('a', { href: `/tasks/${r.id}` }, r.title), ' ', stateBadge(r.state), ' ', moneyEl(r.costUsd ?? null)))),
  );
}

/**
 * Builds /tasks/{id} into `main`.
 * @param {HTMLElement} main
 * @param {string} id
 */
export function taskPage(main, id) {
  document.title = 'Task · agentry';
  const status = h('p', { class: 'state', role: 'status' }, 'Loading…');
  const body = h('div', { class: 'task' });
  const output = h('pre', { class: 'log', tabindex: '0', 'aria-label': 'Agent output' });
  const outputNote = h('p', { class: 'note' });
  const outputRegion = region('Agent output', { class: 'panel wide' }, outputNote, output);
  fill(main, h('p', { class: 'crumbs' }, h('a', { href: '/costs' }, 'Costs'), ' / task'), status, body, outputRegion);
  /** @type {number | undefined} */
  let timer;

  const loadLog = async () => {
    try {
      const log = await apiText(`/api/tasks/${id}/log`);
      if (!log) {
        outputNote.textContent = 'No output yet.';
        output.textContent = '';
        return;
      }
      const lines = log.text.split('\n');
      const tail = lines.slice(-TAIL_LINES).join('\n');
      outputNote.textContent =
        lines.length > TAIL_LINES || log.truncated ? `The last ${TAIL_LINES} lines.` : '';
      const atEnd = output.scrollTop + output.clientHeight >= output.scrollHeight - 4;
      output.textContent = tail;
      if (atEnd) output.scrollTop = output.scrollHeight;
    } catch (err) {
      outputNote.textContent = err instanceof ApiError ? `The output could not be loaded: ${err.message}` : 'The output could not be loaded.';
    }
  };

  /**
   * @param {string} action cancel or retry
   * @param {HTMLElement} problem
   */
  const act = async (action, problem) => {
    problem.textContent = '';
    try {
      /** @type {TaskDto} */
      const t = await api(`/api/tasks/${id}/${action}`, { method: 'POST' });
      status.textContent = `Task ${stateLabel(t.state).toLowerCase()}.`;
      await load();
    } catch (err) {
      problem.textContent = err instanceof ApiError ? err.message : 'The API could not be reached.';
    }
  };

  /** @param {TaskDetailDto} t */
  const actions = (t) => {
    if (!can('member')) return null;
    const problem = h('p', { class: 'field-error', role: 'alert' });
    const cancel = LIVE.includes(t.state) ? h('button', { type: 'button', class: 'danger' }, 'Cancel') : null;
    const retry = !t.imported && (t.state === 'failed' || t.state === 'cancelled') ? h('button', { type: 'button' }, 'Retry') : null;
    cancel?.addEventListener('click', () => act('cancel', problem));
    retry?.addEventListener('click', () => act('retry', problem));
    if (!cancel && !retry) return null;
    return h('div', { class: 'actions' }, cancel, retry, problem);
  };

  const load = async () => {
    window.clearTimeout(timer);
    try {
      /** @type {TaskDetailDto} */
      const t = await api(`/api/tasks/${id}`);
      document.title = `${t.title} · agentry`;
      fill(
        body,
        h('div', { class: 'page-head' }, h('h1', {}, t.title), actions(t)),
        overview(t),
        t.prompt ? h('details', { class: 'prompt' }, h('summary', {}, 'Prompt'), h('pre', {}, t.prompt)) : null,
        h('div', { class: 'columns' }, history(t), reviews(t)),
        runs(t),
        rounds(t),
        egress(t),
      );
      status.textContent = '';
      await loadLog();
      main.dataset.ready = `task:${t.state}`;
      if (LIVE.includes(t.state)) timer = window.setTimeout(load, REFRESH_MS);
    } catch (err) {
      status.className = 'state error';
      status.textContent =
        err instanceof ApiError && err.status === 404
          ? 'There is no such task.'
          : `The task could not be loaded: ${err instanceof ApiError ? err.message : 'the API could not be reached.'}`;
      outputRegion.hidden = true;
      main.dataset.ready = 'error';
    }
  };
  void load();
}
