// @ts-check
/** Small DOM helpers: elements from tag, attributes and children, never from HTML strings. */

/** @typedef {Node | string | number | null | undefined | false} Child */
/** @typedef {Record<string, string | number | boolean | null | undefined | EventListener>} Attrs */

/**
 * Sets `attrs` on `el`: `on*` functions become listeners, `false`/`null`/`undefined` are
 * left out, `true` is an empty attribute.
 * @param {Element} el
 * @param {Attrs} attrs
 */
function setAttrs(el, attrs) {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === false || value === null || value === undefined) continue;
    if (typeof value === 'function') {
      el.addEventListener(name.slice(2), value);
    } else {
      el.setAttribute(name, value === true ? '' : String(value));
    }
  }
}

/**
 * @param {Element} el
 * @param {Child[]} children
 */
function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    el.append(typeof child === 'number' ? String(child) : child);
  }
}

/**
 * An HTML element.
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Attrs} [attrs]
 * @param {...Child} children
 * @returns {HTMLElementTagNameMap[K]}
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

/**
 * An SVG element.
 * @param {string} tag
 * @param {Attrs} [attrs]
 * @param {...Child} children
 * @returns {SVGElement}
 */
export function s(tag, attrs = {}, ...children) {
  const el = /** @type {SVGElement} */ (
    document.createElementNS('http://www.w3.org/2000/svg', tag)
  );
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

let nextId = 0;
/**
 * A document-unique id with this prefix.
 * @param {string} prefix
 */
export function uid(prefix) {
  nextId += 1;
  return `${prefix}-${nextId}`;
}

/**
 * A labelled region: a section named by its heading (the accessible name tests use).
 * @param {string} name
 * @param {Attrs} attrs
 * @param {...Child} children
 */
export function region(name, attrs, ...children) {
  const id = uid('r');
  return h(
    'section',
    { ...attrs, 'aria-labelledby': id },
    h('h2', { id }, name),
    ...children,
  );
}

/**
 * The column heads of a table.
 * @param {string[]} head
 * @param {boolean[]} numeric which columns are numbers (aligned right)
 */
export function tableHead(head, numeric) {
  return h('thead', {}, h('tr', {}, ...head.map((c, i) => h('th', { scope: 'col', class: numeric[i] ? 'num' : '' }, c))));
}

/**
 * A table body of rows of cells; the first cell of a row is its header.
 * @param {Child[][]} rows
 * @param {boolean[]} numeric which columns are numbers (aligned right)
 */
export function headedRows(rows, numeric) {
  return h(
    'tbody',
    {},
    ...rows.map((row) => h('tr', {}, ...row.map((c, i) => (i === 0 ? h('th', { scope: 'row' }, c) : h('td', { class: numeric[i] ? 'num' : '' }, c))))),
  );
}

/**
 * A wide panel named `name` holding a table with the column heads `head` and the table rows
 * `rows`, or the note `empty` when there are no rows.
 * @param {string} name
 * @param {string[]} head
 * @param {boolean[]} numeric which columns are numbers (aligned right)
 * @param {HTMLTableRowElement[]} rows
 * @param {string} empty
 */
export function tablePanel(name, head, numeric, rows, empty) {
  return region(
    name,
    { class: 'panel wide' },
    rows.length === 0
      ? h('p', { class: 'state' }, empty)
      : h('div', { class: 'table-wrap' }, h('table', {}, tableHead(head, numeric), h('tbody', {}, ...rows))),
  );
}

/**
 * Replaces the children of `el`.
 * @param {Element} el
 * @param {...Child} children
 */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/**
 * The element with this id, or an error naming it.
 * @param {string} id
 * @returns {HTMLElement}
 */
export function byId(id) {
  const el = document.getElementById(id);
  if (!el) throw new Error(`the page has no #${id}`);
  return el;
}
