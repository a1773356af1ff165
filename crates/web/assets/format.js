// @ts-check
/**
 * How values are shown. Money is never computed on: the API's exact decimal strings are
 * shown digit for digit, with a dollar sign and thousands grouping. Times are shown in the
 * browser's time zone with the UTC time in a tooltip.
 */
import { h } from './dom.js';

/**
 * The plain decimal digits of a JSON number as JavaScript prints it (the shortest text that
 * reads back as the same number, which for the API's numbers is the text it sent), without
 * exponent notation: `1e-7` → `0.0000001`, `1.5e21` → `1500000000000000000000`.
 * @param {number} n
 * @returns {string}
 */
export function plainDecimal(n) {
  const text = String(n);
  const m = /^(-?)(\d+)(?:\.(\d+))?e([+-]\d+)$/.exec(text);
  if (!m) return text;
  const [, sign, int, frac = '', exp] = m;
  const digits = int + frac;
  const point = int.length + Number(exp);
  if (point <= 0) return `${sign}0.${'0'.repeat(-point)}${digits}`;
  if (point >= digits.length) return sign + digits + '0'.repeat(point - digits.length);
  return `${sign}${digits.slice(0, point)}.${digits.slice(point)}`;
}

/**
 * Groups the integer digits of a decimal string by thousands: `1234567.5` → `1,234,567.5`.
 * @param {string} decimal
 */
export function group(decimal) {
  const m = /^(-?)(\d+)(\.\d+)?$/.exec(decimal);
  if (!m) return decimal;
  const [, sign, int, frac = ''] = m;
  return sign + int.replace(/\B(?=(\d{3})+(?!\d))/g, ',') + frac;
}

/**
 * Money as `$1,234.5678` from the API's decimal string (or JSON number), exactly as sent.
 * Null (no cost recorded) is an en dash.
 * @param {string | number | null | undefined} value
 */
export function money(value) {
  if (value === null || value === undefined) return '–';
  const decimal = typeof value === 'number' ? plainDecimal(value) : value;
  const grouped = group(decimal);
  return grouped.startsWith('-') ? `−$${grouped.slice(1)}` : `$${grouped}`;
}

/**
 * An integer with grouping: `1234567` → `1,234,567`.
 * @param {number | null | undefined} n
 */
export function count(n) {
  if (n === null || n === undefined) return '–';
  return group(String(n));
}

/**
 * A percentage the API sent as a decimal string (`"-12.5"`), with its sign: `+12.5%`.
 * @param {string} value
 */
export function signedPercent(value) {
  if (value.startsWith('-')) return `−${value.slice(1)}%`;
  return /^0(\.0+)?$/.test(value) ? `${value}%` : `+${value}%`;
}

const local = new Intl.DateTimeFormat(undefined, {
  dateStyle: 'medium',
  timeStyle: 'short',
});

/**
 * `2026-11-23 13:14:35 UTC` from an RFC 3339 time.
 * @param {string} iso
 */
export function utcText(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC');
}

/**
 * A `<time>` in the browser's time zone, with the UTC time as its tooltip.
 * @param {string | null | undefined} iso
 * @returns {HTMLElement | string}
 */
export function time(iso) {
  if (!iso) return '–';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return h('time', { datetime: iso, title: utcText(iso) }, local.format(d));
}

const dayFormat = new Intl.DateTimeFormat('en', {
  month: 'short',
  day: 'numeric',
  timeZone: 'UTC',
});

/**
 * A UTC calendar day (`2026-11-23`) as `Nov 23`.
 * @param {string} date
 */
export function utcDay(date) {
  const d = new Date(`${date}T00:00:00Z`);
  return Number.isNaN(d.getTime()) ? date : dayFormat.format(d);
}

/**
 * `https://github.com/acme/web` → `acme/web`.
 * @param {string} url
 */
export function repoName(url) {
  const m = /^https?:\/\/[^/]+\/(.+)$/.exec(url);
  return m ? m[1] : url;
}

/**
 * A task state for people: `pr_opened` → `PR opened`.
 * @param {string} state
 */
export function stateLabel(state) {
  return state === 'pr_opened' ? 'PR opened' : state.charAt(0).toUpperCase() + state.slice(1);
}

/**
 * A badge for a task state.
 * @param {string} state
 */
export function stateBadge(state) {
  return h('span', { class: `badge state-${state}` }, stateLabel(state));
}
