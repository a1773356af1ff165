// @ts-check
/**
 * /costs: the cost dashboard. One request (`GET /api/analytics/costs`) draws every card,
 * chart, notice and the table; the filters live in the URL; an answer to an older filter
 * never replaces a newer one.
 */
import { api, ApiError } from './api.js';
import { fill, h, region } from './dom.js';
import { count, money, repoName, signedPercent, stateBadge } from './format.js';
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
    card('Total cost', money(r.summary.totalCost), `over the last ${r.summary.days} days`),
    card('Task count', count(r.summary.tasksWithCost), `tasks with a recorded cost, of ${count(r.summary.taskCount)} created`),
    card('Average cost', money(r.summary.avgCost), 'per task with a recorded cost'),
    card(
      'Cost trend',
      h('span', { class: `trend trend-${direction}` }, h('span', { 'aria-hidden': 'true' }, `${arrow} `), signedPercent(trend), h('span', { class: 'sr-only' }, ` (${words})`)),
      `previous ${r.summary.days} days: ${money(r.summary.prevPeriodCost)}`,
    ),
  );
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
      h('strong', {}, money(f.monthCostSoFar)),
      '. Forecast for the month: ',
      h('strong', {}, money(f.forecastedMonthTotal)),
      ` at ${money(f.dailyAvgCost)} a day, with ${count(f.daysRemaining)} ${f.daysRemaining === 1 ? 'day' : 'days'} left.`,
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
              ` (${repoName(a.repoUrl)}) cost ${money(a.costUsd)}, ${a.costRatio.toFixed(1)}× the repository’s average of ${money(a.repoAvgCost)}.`,
            ),
          ),
        ),
  );
  const suggestions = region(
    'Model suggestions',
    { class: 'notice' + (r.modelSuggestions.length ? ' tip' : '') },
    r.modelSuggestions.length === 0
      ? h('p', {}, 'No cheaper model with proven results to suggest.')
      : h(
          'ul',
          {},
          ...r.modelSuggestions.map((m) =>
            h(
              'li',
              {},
              `${repoName(m.repoUrl)}: `,
              h('strong', {}, m.suggestedModel),
              ` instead of ${m.currentModel} would have saved about ${money(m.estimatedSavings)} over ${count(m.taskCount)} tasks (${money(m.cheaperModelAvgCost)} instead of ${money(m.avgCost)} a task).`,
            ),
          ),
        ),
  );
  return h('div', { class: 'notices' }, forecast, anomalies, suggestions);
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
      h('td', { class: 'num' }, money(t.costUsd)),
    );
    row.addEventListener('click', (e) => {
      if (!(e.target instanceof HTMLAnchorElement)) location.assign(href);
    });
    return row;
  });
  return region(
    'Most expensive tasks',
    { class: 'panel wide' },
    r.topTasks.length === 0
      ? h('p', { class: 'state' }, 'No task with a recorded cost in this period.')
      : h(
          'div',
          { class: 'table-wrap' },
          h(
            'table',
            {},
            h('thead', {}, h('tr', {}, ...head.map((c, i) => h('th', { scope: 'col', class: numeric[i] ? 'num' : '' }, c)))),
            h('tbody', {}, ...rows),
          ),
        ),
  );
}

/**
 * Draws the report.
 * @param {CostReport} r
 */
function report(r) {
  if (r.summary.taskCount === 0) {
    return h('div', {}, cards(r), h('p', { class: 'state empty' }, 'No tasks in this period.'), notices(r));
  }
  return h(
    'div',
    {},
    cards(r),
    notices(r),
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

