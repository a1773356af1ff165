// @ts-check
/**
 * The three cost charts, drawn as SVG by this code: an area chart, horizontal bars and a pie.
 * Each is a figure with a text alternative (a summary as the image's name and the data as a
 * table), hover tooltips with the exact values, and keyboard access: the chart takes focus,
 * the arrow keys move between its points and the tooltip follows.
 *
 * Geometry uses floating point (pixels); values are shown to the cent (format.js), the exact
 * values in the data tables.
 */
import { h, headedRows, s, tableHead } from './dom.js';
import { count, exactMoney, money, percent, plainDecimal, repoName, utcDay } from './format.js';

/** @typedef {import('../types/api').DailyCost} DailyCost */
/** @typedef {import('../types/api').RepoCost} RepoCost */
/** @typedef {import('../types/api').TypeCost} TypeCost */


/**
 * Round axis ticks from 0 to at least `max`: steps of 1, 2, 2.5 or 5 × 10^k.
 * @param {number} max
 * @param {number} [wanted]
 * @param {number} [minStep] the smallest step (a cent for money axes)
 * @returns {{ticks: number[], decimals: number}}
 */
export function niceTicks(max, wanted = 4, minStep = 0) {
  if (!(max > 0)) return { ticks: [0, 1], decimals: 0 };
  const raw = Math.max(max / wanted, minStep);
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  // 2.5 × the smallest step would need a decimal more than the step has.
  const multiples = minStep > 0 && power < minStep * 1.5 ? [1, 2, 5, 10] : [1, 2, 2.5, 5, 10];
  const step = multiples.map((m) => m * power).find((st) => st >= raw * (1 - 1e-9)) ?? 10 * power;
  const ticks = [];
  for (let i = 0; i * step < max + step * 1e-9; i += 1) ticks.push(i * step);
  if (ticks[ticks.length - 1] < max) ticks.push(ticks.length * step);
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9) + (step / power === 2.5 ? 1 : 0));
  return { ticks, decimals };
}

/**
 * A tick label as money: `$1,500`, `$0.25` (ticks are at least a cent apart).
 * @param {number} v
 * @param {number} decimals
 */
function moneyTick(v, decimals) {
  return money(plainDecimal(v), { places: decimals === 0 ? 0 : 2 });
}

/** A cent: the smallest step of a money axis. */
const CENT = 0.01;

/** The shared tooltip element (in the shell). */
function tooltipEl() {
  return /** @type {HTMLElement} */ (document.getElementById('tooltip'));
}

/**
 * Shows the tooltip with `lines` near the point (x, y) of the viewport.
 * @param {string[]} lines
 * @param {number} x
 * @param {number} y
 */
function showTooltip(lines, x, y) {
  const tip = tooltipEl();
  if (!tip) return;
  tip.replaceChildren(...lines.map((l, i) => h(i === 0 ? 'strong' : 'span', {}, l)));
  tip.hidden = false;
  const width = tip.offsetWidth;
  const left = Math.min(Math.max(8, x + 12), window.innerWidth - width - 8);
  tip.style.left = `${left + window.scrollX}px`;
  tip.style.top = `${y + window.scrollY + 14}px`;
}

function hideTooltip() {
  const tip = tooltipEl();
  if (tip) tip.hidden = true;
}

/**
 * @typedef {object} Point
 * @property {Element} target the element hovered (its box places the tooltip for keys)
 * @property {string[]} lines the tooltip's lines, exact values
 */

/**
 * Hover and keyboard behaviour over the points of a chart.
 * @param {SVGElement} svg the focusable chart
 * @param {HTMLElement} live a polite live region announcing the active point
 * @param {Point[]} points
 * @param {(i: number | null) => void} highlight
 */
function interact(svg, live, points, highlight) {
  /** @type {number | null} */
  let active = null;
  /** @param {number | null} i @param {{x: number, y: number} | null} at */
  const activate = (i, at) => {
    active = i;
    highlight(i);
    if (i === null) {
      hideTooltip();
      return;
    }
    const point = points[i];
    let where = at;
    if (!where) {
      const box = point.target.getBoundingClientRect();
      where = { x: box.left + box.width / 2, y: box.top };
      live.textContent = point.lines.join(', ');
    }
    showTooltip(point.lines, where.x, where.y);
  };
  points.forEach((point, i) => {
    point.target.addEventListener('mousemove', (e) => {
      const m = /** @type {MouseEvent} */ (e);
      activate(i, { x: m.clientX, y: m.clientY });
    });
    point.target.addEventListener('mouseleave', () => activate(null, null));
  });
  svg.addEventListener('focus', () => activate(active ?? 0, null));
  svg.addEventListener('blur', () => activate(null, null));
  svg.addEventListener('keydown', (e) => {
    const k = /** @type {KeyboardEvent} */ (e);
    if (points.length === 0) return;
    const last = points.length - 1;
    const now = active ?? 0;
    /** @type {Record<string, number>} */
    const moves = {
      ArrowRight: Math.min(last, now + 1),
      ArrowDown: Math.min(last, now + 1),
      ArrowLeft: Math.max(0, now - 1),
      ArrowUp: Math.max(0, now - 1),
      Home: 0,
      End: last,
    };
    if (k.key in moves) {
      k.preventDefault();
      activate(moves[k.key], null);
    } else if (k.key === 'Escape') {
      activate(null, null);
    }
  });
}

/**
 * The figure around a chart: the SVG (an image named by `summary`, focusable when it has
 * points), its legend, a live region and the data as a table behind a disclosure.
 * @param {SVGElement} svg
 * @param {string} summary
 * @param {Node | null} legend
 * @param {HTMLTableElement} table
 * @param {Point[]} points
 * @param {(i: number | null) => void} highlight
 */
function figure(svg, summary, legend, table, points, highlight) {
  const live = h('p', { class: 'sr-only', 'aria-live': 'polite' });
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', summary);
  svg.classList.add('chart');
  if (points.length > 0) {
    svg.setAttribute('tabindex', '0');
    svg.setAttribute('aria-roledescription', 'chart; arrow keys show each value');
    interact(svg, live, points, highlight);
  }
  return h(
    'figure',
    { class: 'chart-figure' },
    svg,
    legend,
    live,
    h('details', { class: 'data' }, h('summary', {}, 'Data table'), table),
  );
}

/**
 * The data table of a chart: per entry its label, exact cost and costed tasks.
 * @param {string} caption
 * @param {string} label the heading of the labels' column
 * @param {[string, number, number][]} rows label, cost and costed tasks of each entry
 */
function dataTable(caption, label, rows) {
  const numeric = [false, true, true];
  return h(
    'table',
    {},
    h('caption', {}, caption),
    tableHead([label, 'Cost', 'Costed tasks'], numeric),
    headedRows(
      rows.map(([name, cost, tasks]) => [name, exactMoney(cost), count(tasks)]),
      numeric,
    ),
  );
}

/**
 * Daily costs: the cost of each UTC day as an area (left axis) and its costed task count as
 * a line (right axis).
 * @param {DailyCost[]} days
 */
export function dailyChart(days) {
  const W = 960;
  const H = 300;
  const left = 72;
  const right = 48;
  const top = 12;
  const bottom = 40;
  const plotW = W - left - right;
  const plotH = H - top - bottom;
  const costs = days.map((d) => d.cost);
  const counts = days.map((d) => d.taskCount);
  const cy = niceTicks(Math.max(0, ...costs), 4, CENT);
  const ny = niceTicks(Math.max(0, ...counts), 4);
  const cMax = cy.ticks[cy.ticks.length - 1];
  const nMax = ny.ticks[ny.ticks.length - 1];
  const n = days.length;
  /** @param {number} i */
  const x = (i) => left + (n <= 1 ? plotW / 2 : (i * plotW) / (n - 1));
  /** @param {number} v */
  const yc = (v) => top + plotH - (v / cMax) * plotH;
  /** @param {number} v */
  const yn = (v) => top + plotH - (v / nMax) * plotH;
  const base = top + plotH;
  const line = days.map((d, i) => `${i === 0 ? 'M' : 'L'}${x(i).toFixed(1)},${yc(d.cost).toFixed(1)}`).join('');
  const area = n > 0 ? `${line}L${x(n - 1).toFixed(1)},${base}L${x(0).toFixed(1)},${base}Z` : '';
  const countLine = days.map((d, i) => `${i === 0 ? 'M' : 'L'}${x(i).toFixed(1)},${yn(d.taskCount).toFixed(1)}`).join('');
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}` });
  // Axes and grid.
  for (const t of cy.ticks) {
    svg.append(
      s('line', { class: 'grid', x1: left, x2: W - right, y1: yc(t), y2: yc(t) }),
      s('text', { class: 'tick', x: left - 6, y: yc(t) + 4, 'text-anchor': 'end' }, moneyTick(t, cy.decimals)),
    );
  }
  for (const t of ny.ticks) {
    svg.append(s('text', { class: 'tick count', x: W - right + 6, y: yn(t) + 4 }, count(Math.round(t * 100) / 100)));
  }
  const labelEvery = Math.max(1, Math.ceil(n / 7));
  days.forEach((d, i) => {
    if (i % labelEvery === 0 || i === n - 1) {
      if (i === n - 1 && i % labelEvery !== 0 && i % labelEvery < labelEvery / 2) return;
      svg.append(s('text', { class: 'tick', x: x(i), y: base + 16, 'text-anchor': 'middle' }, utcDay(d.date)));
    }
  });
  svg.append(s('text', { class: 'axis-title', x: left + plotW / 2, y: H - 4, 'text-anchor': 'middle' }, 'Day (UTC)'));
  svg.append(s('path', { class: 'area', d: area }), s('path', { class: 'area-line', d: line }));
  svg.append(s('path', { class: 'count-line', d: countLine }));
  const guide = s('line', { class: 'guide', x1: 0, x2: 0, y1: top, y2: base, visibility: 'hidden' });
  const dot = s('circle', { class: 'dot', r: 4, cx: 0, cy: 0, visibility: 'hidden' });
  svg.append(guide, dot);
  /** @type {Point[]} */
  const points = days.map((d, i) => {
    const half = n <= 1 ? plotW / 2 : plotW / (n - 1) / 2;
    const col = s('rect', { class: 'hit', x: x(i) - half, y: top, width: half * 2, height: plotH });
    svg.append(col);
    return {
      target: col,
      lines: [`${utcDay(d.date)} (UTC day ${d.date})`, `Cost ${money(d.cost)}`, `Tasks ${count(d.taskCount)}`],
    };
  });
  /** @param {number | null} i */
  const highlight = (i) => {
    const on = i === null ? 'hidden' : 'visible';
    guide.setAttribute('visibility', on);
    dot.setAttribute('visibility', on);
    if (i !== null) {
      guide.setAttribute('x1', String(x(i)));
      guide.setAttribute('x2', String(x(i)));
      dot.setAttribute('cx', String(x(i)));
      dot.setAttribute('cy', String(yc(days[i].cost)));
    }
  };
  let peak = 0;
  days.forEach((d, i) => {
    if (d.cost > days[peak].cost) peak = i;
  });
  const total = counts.reduce((a, b) => a + b, 0);
  const summary =
    n === 0
      ? 'Daily costs: no days'
      : `Daily costs over ${n} UTC days, ${days[0].date} to ${days[n - 1].date}: ` +
        `highest ${money(days[peak].cost)} on ${days[peak].date}; ${count(total)} costed tasks.`;
  const legend = h(
    'p',
    { class: 'legend' },
    h('span', { class: 'key key-area' }),
    'Cost (left axis) ',
    h('span', { class: 'key key-count' }),
    'Costed tasks (right axis). Days are UTC calendar days.',
  );
  const table = dataTable(
    'Daily costs (UTC days)',
    'Day (UTC)',
    days.map((d) => [d.date, d.cost, d.taskCount]),
  );
  return figure(svg, summary, legend, table, points, highlight);
}

/**
 * Cost by repository: one horizontal bar per repository, highest first (the API's order).
 * @param {RepoCost[]} repos
 */
export function repoChart(repos) {
  const shown = repos.slice(0, 12);
  const W = 520;
  const left = 130;
  const right = 120;
  const top = 8;
  const barH = 22;
  const gap = 8;
  const axis = 28;
  const H = top + shown.length * (barH + gap) + axis;
  const plotW = W - left - right;
  const xs = niceTicks(Math.max(0, ...shown.map((r) => r.totalCost)), 4, CENT);
  const xMax = xs.ticks[xs.ticks.length - 1];
  /** @param {number} v */
  const x = (v) => left + (v / xMax) * plotW;
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}` });
  const base = top + shown.length * (barH + gap);
  for (const t of xs.ticks) {
    svg.append(
      s('line', { class: 'grid', x1: x(t), x2: x(t), y1: top, y2: base }),
      s('text', { class: 'tick', x: x(t), y: base + 16, 'text-anchor': 'middle' }, moneyTick(t, xs.decimals)),
    );
  }
  /** @type {Element[]} */
  const bars = [];
  /** @type {Point[]} */
  const points = shown.map((r, i) => {
    const y = top + i * (barH + gap);
    const name = repoName(r.repoUrl);
    const bar = s('rect', { class: 'bar', x: left, y, width: Math.max(1, x(r.totalCost) - left), height: barH, rx: 2 });
    bars.push(bar);
    svg.append(
      s('text', { class: 'bar-label', x: left - 8, y: y + barH / 2 + 4, 'text-anchor': 'end' }, name.length > 24 ? `${name.slice(0, 23)}…` : name),
      bar,
      s('text', { class: 'bar-value', x: x(r.totalCost) + 6, y: y + barH / 2 + 4 }, money(r.totalCost, { total: true })),
    );
    return { target: bar, lines: [name, `Cost ${money(r.totalCost)}`, `Tasks ${count(r.taskCount)}`] };
  });
  /** @param {number | null} i */
  const highlight = (i) => bars.forEach((b, j) => b.classList.toggle('active', i === j));
  const summary =
    repos.length === 0
      ? 'Cost by repository: no repositories'
      : `Cost by repository, ${repos.length} repositories, highest first: ` +
        repos
          .slice(0, 3)
          .map((r) => `${repoName(r.repoUrl)} ${money(r.totalCost)}`)
          .join(', ') +
        (repos.length > 3 ? ', …' : '.');
  const note = repos.length > shown.length ? h('p', { class: 'legend' }, `The ${shown.length} costliest of ${repos.length} repositories; the data table lists all.`) : null;
  const table = dataTable(
    'Cost by repository',
    'Repository',
    repos.map((r) => [repoName(r.repoUrl), r.totalCost, r.taskCount]),
  );
  return figure(svg, summary, note, table, points, highlight);
}

/**
 * The share of `part` in `whole` as a percentage with one decimal (a label only).
 * @param {number} part
 * @param {number} whole
 */
function share(part, whole) {
  return percent(whole > 0 ? (part / whole) * 100 : 0);
}

/**
 * Cost by task type as a pie.
 * @param {TypeCost[]} types
 */
export function typeChart(types) {
  const cx = 110;
  const cy = 110;
  const r = 100;
  const total = types.reduce((a, t) => a + t.totalCost, 0);
  const svg = s('svg', { viewBox: '0 0 220 220', class: 'pie' });
  const legend = h('ul', { class: 'pie-legend' });
  /** @type {Element[]} */
  const slices = [];
  let angle = -Math.PI / 2;
  /** @type {Point[]} */
  const points = types.map((t, i) => {
    const sweep = total > 0 ? (t.totalCost / total) * Math.PI * 2 : 0;
    const a0 = angle;
    const a1 = angle + sweep;
    angle = a1;
    let slice;
    if (sweep >= Math.PI * 2 - 1e-9) {
      slice = s('circle', { cx, cy, r });
    } else {
      const large = sweep > Math.PI ? 1 : 0;
      const p0 = `${(cx + r * Math.cos(a0)).toFixed(2)},${(cy + r * Math.sin(a0)).toFixed(2)}`;
      const p1 = `${(cx + r * Math.cos(a1)).toFixed(2)},${(cy + r * Math.sin(a1)).toFixed(2)}`;
      slice = s('path', { d: `M${cx},${cy}L${p0}A${r},${r} 0 ${large} 1 ${p1}Z` });
    }
    slice.setAttribute('class', `slice slice-${i % 4}`);
    slices.push(slice);
    svg.append(slice);
    legend.append(
      h('li', {}, h('span', { class: `swatch swatch-${i % 4}` }), h('strong', {}, t.taskType), `: ${money(t.totalCost)} (${share(t.totalCost, total)}), ${count(t.taskCount)} tasks`),
    );
    return {
      target: slice,
      lines: [t.taskType, `Cost ${money(t.totalCost)}`, `Share ${share(t.totalCost, total)}`, `Tasks ${count(t.taskCount)}`],
    };
  });
  /** @param {number | null} i */
  const highlight = (i) => slices.forEach((sl, j) => sl.classList.toggle('active', i === j));
  const summary =
    types.length === 0
      ? 'Cost by task type: no costed tasks'
      : 'Cost by task type: ' + types.map((t) => `${t.taskType} ${money(t.totalCost)} (${share(t.totalCost, total)})`).join(', ');
  const table = dataTable(
    'Cost by task type',
    'Task type',
    types.map((t) => [t.taskType, t.totalCost, t.taskCount]),
  );
  return figure(svg, summary, legend, table, points, highlight);
}
