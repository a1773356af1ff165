// @ts-check
/**
 * How values are shown. Money is never computed on in floating point: the API's exact
 * decimal strings are rounded half up on their digits, to the cent (a total of $1,000 or more
 * to the dollar), and the exact value stays in a tooltip and in the charts' data tables.
 * Ratios and percentages have one decimal. Times are shown in the browser's time zone with
 * the UTC time in a tooltip.
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
 * A decimal string rounded half up (away from zero) to `places` decimals, on its digits (no
 * floating point): `roundDecimal("2.0069648", 2)` → `2.01`, `roundDecimal("-0.004", 2)` →
 * `0.00`. Text that is not a plain decimal comes back unchanged.
 * @param {string} decimal
 * @param {number} places 0 or more
 */
export function roundDecimal(decimal, places) {
  const m = /^(-?)(\d+)(?:\.(\d*))?$/.exec(decimal);
  if (!m) return decimal;
  const [, sign, int, frac = ''] = m;
  let digits = int + frac.slice(0, places).padEnd(places, '0');
  if (frac.length > places && frac.charCodeAt(places) >= 53 /* '5' */) {
    const d = digits.split('');
    let i = d.length - 1;
    while (i >= 0 && d[i] === '9') {
      d[i] = '0';
      i -= 1;
    }
    if (i < 0) d.unshift('1');
    else d[i] = String(Number(d[i]) + 1);
    digits = d.join('');
  }
  const point = digits.length - places;
  const whole = digits.slice(0, point).replace(/^0+(?=\d)/, '');
  const text = places > 0 ? `${whole}.${digits.slice(point)}` : whole;
  return /^[0.]+$/.test(text) ? text : sign + text;
}

/**
 * The decimal text of the API's money (a decimal string, or a JSON number of an array
 * member), exactly as sent.
 * @param {string | number} value
 */
function decimalOf(value) {
  return typeof value === 'number' ? plainDecimal(value) : value;
}

/**
 * `$1,234.5678` from a decimal text, with a minus sign for a negative value.
 * @param {string} decimal
 */
function dollars(decimal) {
  const grouped = group(decimal);
  return grouped.startsWith('-') ? `−$${grouped.slice(1)}` : `$${grouped}`;
}

/**
 * @typedef {object} MoneyOptions
 * @property {boolean} [total] a total: from $1,000 on, shown to the dollar
 * @property {number} [places] decimals (default 2, the cent)
 */

/**
 * Money as shown: `$1,234.57` from the API's decimal string (or JSON number), rounded half
 * up on its digits; a total of $1,000 or more as `$433,739`. Null (no cost recorded) is an
 * en dash.
 * @param {string | number | null | undefined} value
 * @param {MoneyOptions} [options]
 */
export function money(value, options = {}) {
  if (value === null || value === undefined) return '–';
  const decimal = decimalOf(value);
  let places = options.places ?? 2;
  if (options.total && /^-?\d{4,}/.test(decimal)) places = 0;
  return dollars(roundDecimal(decimal, places));
}

/**
 * Money exactly as the API sent it, grouped: `$1,234.567891234` (tooltips, data tables).
 * @param {string | number | null | undefined} value
 */
export function exactMoney(value) {
  if (value === null || value === undefined) return '–';
  return dollars(decimalOf(value));
}

/**
 * Money as shown ({@link money}) in an element whose tooltip (`title`) is the exact value.
 * @param {string | number | null | undefined} value
 * @param {MoneyOptions} [options]
 */
export function moneyEl(value, options = {}) {
  const shown = money(value, options);
  const exact = exactMoney(value);
  return h('span', { class: 'money', title: exact === shown ? null : exact }, shown);
}

/**
 * A ratio or percentage to one decimal, from a JSON number or a decimal string: `3.14159` →
 * `3.1`.
 * @param {number | string} value
 */
export function oneDecimal(value) {
  return roundDecimal(typeof value === 'number' ? plainDecimal(value) : value, 1);
}

/**
 * A percentage to one decimal: `12.5%`.
 * @param {number | string} value
 */
export function percent(value) {
  return `${oneDecimal(value)}%`;
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
  const v = oneDecimal(value);
  if (v.startsWith('-')) return `−${v.slice(1)}%`;
  return /^0(\.0+)?$/.test(v) ? `${v}%` : `+${v}%`;
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
