// @ts-check
/**
 * /costs: the cost dashboard. One request (`GET /api/analytics/costs`) draws every card,
 * chart, notice and the table; the filters live in the URL; an answer to an older filter
 * never replaces a newer one.
 */
import { api, ApiError } from './api.js';
import { fill, h, headedRows, region, tableHead, tablePanel, uid } from './dom.js';
import { count, exactMoney, money, moneyEl, oneDecimal, percent, repoName, signedPercent, stateBadge, utcDay } from './format.js';
import { dailyChart, repoChart, typeChart } from './charts.js';

/** @typedef {import('../types/api').CostReport} CostReport */
/** @typedef {import('../types/api').RepoListDto} RepoListDto */

export const PERIODS = [7, 14, 30, 90];

/** The back/forward handler of the page drawn last (one at a time). */
/** @type {(() => void) | null} */
let onPopState = null;

/**
 * The filters of a URL: `days` (1–365, default 30) and `repoUrl` (optional).
 * @param {URL} url
 * @returns {{days: number, repoUrl: string}}
 */
export function filtersOf(url) {
  const raw = url.searchParams.get('days');
  const days = raw !== null && /^\d{1,3}$/.test(raw) && Number(raw) >= 1 && Number(raw) <= 365 ? Number(raw) : 30;
  return { days, repoUrl: url.searchParams.get('repoUrl') ?? '' };
}

/**
 * The page URL of filters (defaults left out).
 * @param {{days: number, repoUrl: string}} f
 */
function pageUrl(f) {
  const q = new URLSearchParams();
  if (f.days !== 30) q.set('days', String(f.days));
  if (f.repoUrl) q.set('repoUrl', f.repoUrl);
  const text = q.toString();
  return text ? `/costs?${text}` : '/costs';
}

/**
 * A summary card.
 * @param {string} name
 * @param {Node | string} value
 * @param {...(Node | string | null)} notes
 */
function card(name, value, ...notes) {
  return region(name, { class: 'card' }, h('p', { class: 'value' }, value), ...notes.map((n) => (n ? h('p', { class: 'note' }, n) : null)));
}

/** @param {CostReport} r */
function cards(r) {
  const trend = r.summary.costTrend;
  const direction = trend.startsWith('-') ? 'down' : /^0(\.0+)?$/.test(trend) ? 'flat' : 'up';
  const arrow = { up: '▲', down: '▼', flat: '■' }[direction];
  const words = { up: 'up', down: 'down', flat: 'no change' }[direction];
  return h(
    'div',
    { class: 'cards' },
    card('Total cost', moneyEl(r.summary.totalCost, { total: true }), `over the last ${r.summary.days} days`),
    card('Task count', count(r.summary.tasksWithCost), `tasks with a recorded cost, of ${count(r.summary.taskCount)} created`),
    card('Average cost', moneyEl(r.summary.avgCost), 'per task with a recorded cost'),
    card(
      'Cost trend',
      h('span', { class: `trend trend-${direction}` }, h('span', { 'aria-hidden': 'true' }, `${arrow} `), signedPercent(trend), h('span', { class: 'sr-only' }, ` (${words})`)),
      h('span', {}, `previous ${r.summary.days} days: `, moneyEl(r.summary.prevPeriodCost, { total: true })),
    ),
  );
}

/**
 * A compact table: a caption for screen readers, column heads, rows of cells; the first
 * cell of a row is its header.
 * @param {string} caption
 * @param {string[]} head
 * @param {boolean[]} numeric which columns are numbers (aligned right)
 * @param {(Node | string)[][]} rows
 */
function table(caption, head, numeric, rows) {
  return h(
    'div',
    { class: 'table-wrap' },
    h(
      'table',
      { class: 'compact' },
      h('caption', { class: 'sr-only' }, caption),
      tableHead(head, numeric),
      headedRows(rows, numeric),
    ),
  );
}

/**
 * A table of the first `shown` rows and, when there are more, a disclosure "N more …" with
 * a table of the rest.
 * @param {{ caption: string, more: string, one: string, many: string }} names the tables'
 *   captions and what one row and several rows are
 * @param {string[]} head
 * @param {boolean[]} numeric
 * @param {(Node | string)[][]} rows
 * @param {number} shown
 * @returns {Node[]}
 */
function tableWithMore(names, head, numeric, rows, shown) {
  /** @type {Node[]} */
  const nodes = [table(names.caption, head, numeric, rows.slice(0, shown))];
  const rest = rows.slice(shown);
  if (rest.length > 0) {
    nodes.push(
      h(
        'details',
        { class: 'more' },
        h('summary', {}, `${rest.length} more ${rest.length === 1 ? names.one : names.many}`),
        table(names.more, head, numeric, rest),
      ),
    );
  }
  return nodes;
}

/** How many model suggestions show before the disclosure. */
const SHOWN_SUGGESTIONS = 3;

/** @param {CostReport} r */
function suggestionsRegion(r) {
  const all = r.modelSuggestions;
  const section = region('Model suggestions', { class: 'notice' + (all.length ? ' tip wide' : '') });
  if (all.length === 0) {
    section.append(h('p', {}, 'No cheaper model with proven results to suggest.'));
    return section;
  }
  const head = ['Repository', 'Current model', 'Suggested model', 'Tasks', 'Saving'];
  const numeric = [false, false, false, true, true];
  /** @param {import('../types/api').ModelSuggestion} m */
  const row = (m) => [
    repoName(m.repoUrl),
    m.currentModel,
    h('strong', {}, m.suggestedModel),
    count(m.taskCount),
    h(
      'span',
      {
        class: 'money',
        title: `${exactMoney(m.estimatedSavings)}: ${exactMoney(m.cheaperModelAvgCost)} instead of ${exactMoney(m.avgCost)} a task`,
      },
      money(m.estimatedSavings),
    ),
  ];
  section.append(
    h('p', { class: 'note' }, 'A cheaper model with at least the same success rate, and what it would have saved in this period.'),
    ...tableWithMore(
      { caption: 'Model suggestions, largest saving first', more: 'More model suggestions', one: 'suggestion', many: 'suggestions' },
      head,
      numeric,
      all.map(row),
      SHOWN_SUGGESTIONS,
    ),
  );
  return section;
}

/** @param {CostReport} r */
function notices(r) {
  const f = r.forecast;
  const forecast = region(
    'Forecast',
    { class: 'notice' },
    h(
      'p',
      {},
      'Month so far (UTC): ',
      h('strong', {}, moneyEl(f.monthCostSoFar, { total: true })),
      '. Forecast for the month: ',
      h('strong', {}, moneyEl(f.forecastedMonthTotal, { total: true })),
      ' at ',
      moneyEl(f.dailyAvgCost),
      ` a day, with ${count(f.daysRemaining)} ${f.daysRemaining === 1 ? 'day' : 'days'} left.`,
    ),
  );
  const anomalies = region(
    'Anomalies',
    { class: 'notice' + (r.anomalies.length ? ' warn' : '') },
    r.anomalies.length === 0
      ? h('p', {}, 'No task cost three times its repository’s average in this period.')
      : h(
          'ul',
          {},
          ...r.anomalies.map((a) =>
            h(
              'li',
              {},
              h('a', { href: `/tasks/${a.id}` }, a.title),
              ` (${repoName(a.repoUrl)}) cost `,
              moneyEl(a.costUsd),
              `, ${oneDecimal(a.costRatio)}× the repository’s average of `,
              moneyEl(a.repoAvgCost),
              '.',
            ),
          ),
        ),
  );
  return h('div', { class: 'notices' }, forecast, anomalies, suggestionsRegion(r));
}

/**
 * A member an older API does not send (`revisionCost`, `avgRevisionsPerMergedPullRequest`),
 * read without assuming it: undefined when absent, null when sent as null.
 * @param {object} o
 * @param {string} name
 * @returns {string | number | null | undefined}
 */
function optional(o, name) {
  if (!(name in o)) return undefined;
  const v = /** @type {Record<string, unknown>} */ (o)[name];
  return typeof v === 'string' || typeof v === 'number' ? v : null;
}

/**
 * A figure of the Outcomes region: a term and its value.
 * @param {string} term
 * @param {Node | string} value
 * @param {Node | string | null} [note]
 */
function figure(term, value, note = null) {
  return h('div', { class: 'figure' }, h('dt', {}, term), h('dd', {}, h('span', { class: 'value' }, value), note ? h('span', { class: 'note' }, ' ', note) : null));
}

/** How many repositories the Outcomes table shows before the disclosure. */
const SHOWN_REPOS = 5;

/** @param {CostReport} r */
function outcomesRegion(r) {
  const o = r.outcomes;
  const revisionCost = optional(o, 'revisionCost');
  const revisions = optional(o, 'avgRevisionsPerMergedPullRequest');
  const figures = h(
    'dl',
    { class: 'figures' },
    figure('Merged pull requests', count(o.mergedPullRequests)),
    figure('Cost per merged pull request', o.costPerMergedPullRequest == null ? 'none merged' : moneyEl(o.costPerMergedPullRequest), h('span', {}, 'of ', moneyEl(o.mergedCost, { total: true }), ' on merged work')),
    figure('Failed spend', moneyEl(o.failedCost, { total: true }), `${percent(o.failedShare)} of the period’s spend`),
    revisionCost === undefined ? null : figure('Revision cost', moneyEl(revisionCost, { total: true })),
    revisions === undefined ? null : figure('Revisions per merged PR', revisions === null ? '–' : oneDecimal(revisions)),
  );
  const section = region('Outcomes', { class: 'panel wide outcomes' }, figures);
  if (o.byRepo.length === 0) {
    section.append(h('p', { class: 'state' }, 'No merged pull request or costed task in this period.'));
    return section;
  }
  const withRevisions = o.byRepo.some((g) => optional(g, 'revisionCost') !== undefined);
  const head = ['Repository', 'Merged PRs', 'Cost per merged PR', 'Merged cost', 'Failed cost', 'Failed share'];
  if (withRevisions) head.push('Revision cost');
  const numeric = head.map((_, i) => i > 0);
  const rows = o.byRepo.map((g) => {
    /** @type {(Node | string)[]} */
    const row = [
      repoName(g.repoUrl),
      count(g.mergedPullRequests),
      g.costPerMergedPullRequest == null ? '–' : moneyEl(g.costPerMergedPullRequest),
      moneyEl(g.mergedCost),
      moneyEl(g.failedCost),
      percent(g.failedShare),
    ];
    if (withRevisions) row.push(moneyEl(optional(g, 'revisionCost')));
    return row;
  });
  section.append(
    h('h3', {}, 'By repository'),
    ...tableWithMore(
      { caption: 'Outcomes by repository, highest spend first', more: 'More outcomes by repository', one: 'repository', many: 'repositories' },
      head,
      numeric,
      rows,
      SHOWN_REPOS,
    ),
  );
  return section;
}

/**
 * The state of a budget from its exact figures: under 80 %, 80 % reached, 100 % reached.
 * @param {string} spent decimal
 * @param {string} limit decimal
 * @returns {{level: 'ok' | 'warn' | 'over', used: string}} `used` the percentage, 1 decimal
 */
export function budgetState(spent, limit) {
  const s = nanos(spent);
  const l = nanos(limit);
  if (l <= 0n) return { level: s > 0n ? 'over' : 'ok', used: s > 0n ? '100.0' : '0.0' };
  // Tenths of a percent, rounded half up: (s / l × 1000), all in integers.
  const tenths = (s * 2000n + l) / (2n * l);
  const used = `${tenths / 10n}.${tenths % 10n}`;
  const level = s >= l ? 'over' : s * 10n >= l * 8n ? 'warn' : 'ok';
  return { level, used };
}

/**
 * A non-negative decimal string as an integer of nanodollars (exact; 9 decimals at most
 * count).
 * @param {string} decimal
 */
function nanos(decimal) {
  const m = /^(\d+)(?:\.(\d+))?$/.exec(decimal);
  if (!m) return 0n;
  return BigInt(m[1]) * 1000000000n + BigInt((m[2] ?? '').slice(0, 9).padEnd(9, '0'));
}

/**
 * What a budget counts, and, when imported history makes the forecast's month differ from a
 * budget's, how much of it is imported (`forecast.monthImportedCostSoFar`).
 * @param {CostReport} r
 */
function budgetsCount(r) {
  const imported = optional(r.forecast, 'monthImportedCostSoFar');
  return h(
    'p',
    { class: 'note budgets-count' },
    'A budget counts what agentry’s own runs that finished this month (UTC) cost. Imported history is not counted.',
    typeof imported === 'string' && nanos(imported) > 0n
      ? h(
          'span',
          { class: 'budgets-imported' },
          ' The forecast’s month so far, ',
          moneyEl(r.forecast.monthCostSoFar, { total: true }),
          ', includes ',
          moneyEl(imported, { total: true }),
          ' of imported history, which no budget counts.',
        )
      : null,
  );
}

/** @param {CostReport} r */
function budgetsRegion(r) {
  const section = region('Budgets', { class: 'panel wide budgets' });
  if (r.budgets.length === 0) {
    section.append(h('p', { class: 'state' }, 'No monthly budget is set (Settings sets the instance’s; each repository’s settings its own).'));
    return section;
  }
  section.append(budgetsCount(r));
  const words = { ok: 'under 80 %', warn: '80 % reached', over: '100 % reached: over budget' };
  const icons = { ok: '✓', warn: '⚠', over: '‼' };
  section.append(
    h(
      'ul',
      { class: 'plain budget-list' },
      ...r.budgets.map((b) => {
        const name = b.scope === 'instance' ? 'Instance' : repoName(b.repoUrl ?? '');
        const { level, used } = budgetState(b.monthToDateUsd, b.monthlyBudgetUsd);
        const meterId = uid('budget');
        const limit = Number(b.monthlyBudgetUsd);
        return h(
          'li',
          { class: `budget budget-${level}` },
          h('h3', { id: meterId }, name, b.scope === 'instance' ? ' (all repositories)' : ''),
          h(
            'p',
            { class: 'budget-line' },
            h('meter', {
              'aria-labelledby': meterId,
              min: 0,
              max: limit > 0 ? limit : 1,
              low: limit * 0.8,
              // Over the budget the bar is drawn as "bad" (past `high`), not only "warning".
              high: level === 'over' ? limit * 0.8 : limit,
              optimum: 0,
              value: Math.min(Number(b.monthToDateUsd), limit > 0 ? limit : 1),
            }),
            h('span', { class: 'budget-state' }, h('span', { 'aria-hidden': 'true' }, `${icons[level]} `), words[level]),
          ),
          h(
            'p',
            {},
            'Month to date ',
            h('strong', {}, moneyEl(b.monthToDateUsd, { total: true })),
            ' of ',
            moneyEl(b.monthlyBudgetUsd, { total: true }),
            ` (${used}%). Forecast for the month: `,
            moneyEl(b.forecastUsd, { total: true }),
            '. ',
            b.exhaustsOn ? `Runs out on ${utcDay(b.exhaustsOn)} (UTC).` : 'Lasts the month at this rate.',
          ),
        );
      }),
    ),
  );
  return section;
}

/** @param {CostReport} r */
function topTable(r) {
  const head = ['Title', 'Repository', 'Task type', 'State', 'Model', 'Input tokens', 'Output tokens', 'Cost'];
  const numeric = [false, false, false, false, false, true, true, true];
  const rows = r.topTasks.map((t) => {
    const href = `/tasks/${t.id}`;
    const row = h(
      'tr',
      { class: 'link-row', 'data-href': href },
      h('th', { scope: 'row' }, h('a', { href }, t.title)),
      h('td', {}, repoName(t.repoUrl)),
      h('td', {}, t.taskType),
      h('td', {}, stateBadge(t.state)),
      h('td', {}, t.modelUsed ?? 'unknown'),
      h('td', { class: 'num' }, count(t.inputTokens)),
      h('td', { class: 'num' }, count(t.outputTokens)),
      h('td', { class: 'num' }, moneyEl(t.costUsd)),
    );
    row.addEventListener('click', (e) => {
      if (!(e.target instanceof HTMLAnchorElement)) location.assign(href);
    });
    return row;
  });
  return tablePanel('Most expensive tasks', head, numeric, rows, 'No task with a recorded cost in this period.');
}

/**
 * Draws the report.
 * @param {CostReport} r
 */
function report(r) {
  if (r.summary.taskCount === 0) {
    return h('div', {}, cards(r), h('p', { class: 'state empty' }, 'No tasks in this period.'), notices(r), budgetsRegion(r));
  }
  return h(
    'div',
    {},
    cards(r),
    notices(r),
    h('div', { class: 'charts' }, outcomesRegion(r), budgetsRegion(r)),
    h(
      'div',
      { class: 'charts' },
      region('Daily costs', { class: 'panel wide' }, dailyChart(r.dailyCosts)),
      region('Cost by repository', { class: 'panel' }, repoChart(r.costByRepo)),
      region('Cost by task type', { class: 'panel' }, typeChart(r.costByType)),
    ),
    topTable(r),
  );
}

/**
 * Builds /costs into `main`.
 * @param {HTMLElement} main
 */
export function costsPage(main) {
  document.title = 'Costs · agentry';
  const period = h(
    'select',
    { id: 'f-period', name: 'days' },
    ...PERIODS.map((d) => h('option', { value: String(d) }, `Last ${d} days`)),
  );
  const repo = h('select', { id: 'f-repo', name: 'repoUrl' }, h('option', { value: '' }, 'All repositories'));
  const status = h('p', { class: 'state', role: 'status' });
  const content = h('div', { class: 'report' });
  const filters = h(
    'form',
    { class: 'filters', 'aria-label': 'Filters' },
    h('label', { for: 'f-period' }, 'Period'),
    period,
    h('label', { for: 'f-repo' }, 'Repository'),
    repo,
  );
  filters.addEventListener('submit', (e) => e.preventDefault());
  fill(main, h('div', { class: 'page-head' }, h('h1', {}, 'Costs'), filters), status, content);

  /** @type {Set<string>} */
  const known = new Set();
  /** @param {string[]} urls */
  const addRepos = (urls) => {
    let added = false;
    for (const u of urls) {
      if (u && !known.has(u)) {
        known.add(u);
        added = true;
      }
    }
    if (!added) return;
    const current = repo.value;
    fill(
      repo,
      h('option', { value: '' }, 'All repositories'),
      ...[...known].sort().map((u) => h('option', { value: u }, repoName(u))),
    );
    repo.value = current;
  };

  /** @param {{days: number, repoUrl: string}} f */
  const showFilters = (f) => {
    if (!PERIODS.includes(f.days) && !period.querySelector(`option[value="${f.days}"]`)) {
      period.append(h('option', { value: String(f.days) }, `Last ${f.days} days`));
    }
    period.value = String(f.days);
    addRepos([f.repoUrl]);
    repo.value = f.repoUrl;
  };

  let latest = 0;
  /** @type {AbortController | null} */
  let inFlight = null;
  /** @param {{days: number, repoUrl: string}} f */
  const load = async (f) => {
    latest += 1;
    const mine = latest;
    inFlight?.abort();
    const controller = new AbortController();
    inFlight = controller;
    const key = `days=${f.days}&repoUrl=${f.repoUrl}`;
    main.dataset.loading = key;
    content.setAttribute('aria-busy', 'true');
    status.className = 'state';
    status.textContent = 'Loading…';
    const q = new URLSearchParams({ days: String(f.days) });
    if (f.repoUrl) q.set('repoUrl', f.repoUrl);
    try {
      /** @type {CostReport} */
      const r = await api(`/api/analytics/costs?${q}`, { signal: controller.signal });
      if (mine !== latest) return;
      if (!f.repoUrl) addRepos(r.costByRepo.map((c) => c.repoUrl));
      fill(content, report(r));
      status.textContent = '';
      content.removeAttribute('aria-busy');
      main.dataset.ready = key;
      delete main.dataset.loading;
      // For measurements (scripts/bench-browser.sh): the frame after this report is drawn.
      requestAnimationFrame(() => setTimeout(() => performance.mark('agentry:costs-rendered', { detail: key }), 0));
    } catch (e) {
      if (mine !== latest || (e instanceof DOMException && e.name === 'AbortError')) return;
      content.removeAttribute('aria-busy');
      delete main.dataset.loading;
      status.className = 'state error';
      status.textContent =
        e instanceof ApiError ? `The cost report could not be loaded: ${e.message}` : 'The cost report could not be loaded.';
      if (!(e instanceof ApiError && e.status === 401)) fill(content);
      main.dataset.ready = 'error';
    }
  };

  const change = () => {
    const f = { days: Number(period.value), repoUrl: repo.value };
    history.pushState(null, '', pageUrl(f));
    void load(f);
  };
  period.addEventListener('change', change);
  repo.addEventListener('change', change);
  if (onPopState) window.removeEventListener('popstate', onPopState);
  onPopState = () => {
    const f = filtersOf(new URL(location.href));
    showFilters(f);
    void load(f);
  };
  window.addEventListener('popstate', onPopState);

  const first = filtersOf(new URL(location.href));
  showFilters(first);
  void load(first);
  // The repository choices: connected repositories, and those with costs (from unfiltered
  // reports; a page opened filtered asks once for the longest period's).
  api(/** @type {string} */ ('/api/repos'))
    .then((/** @type {RepoListDto} */ list) => addRepos(list.repos.map((r) => r.repoUrl)))
    .catch(() => {});
  if (first.repoUrl) {
    api('/api/analytics/costs?days=90')
      .then((/** @type {CostReport} */ r) => addRepos(r.costByRepo.map((c) => c.repoUrl)))
      .catch(() => {});
  }
  return { reload: () => load(filtersOf(new URL(location.href))) };
}

