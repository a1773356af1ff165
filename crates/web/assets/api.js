// @ts-check
/**
 * The API client: base URL, the token kept in this browser with its name and role (from
 * `GET /api/me`), JSON errors. A 401 forgets the token and asks for one again.
 */

/** @typedef {import('../types/api').RoleName} Role */
/** @typedef {import('../types/api').MeDto} MeDto */

const TOKEN_KEY = 'agentry.token';
const ROLE_KEY = 'agentry.role';
const NAME_KEY = 'agentry.name';

/** An error answer of the API (or a network failure, status 0). */
export class ApiError extends Error {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} message
   */
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/**
 * The API's origin: the shell's `<meta name="agentry-api-base">`, or this page's origin.
 * @returns {string}
 */
export function apiBase() {
  const meta = document.querySelector('meta[name="agentry-api-base"]');
  const base = (meta?.getAttribute('content') ?? '').trim().replace(/\/+$/, '');
  return base;
}

/** @returns {string | null} */
export function token() {
  try {
    return localStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

/**
 * Keeps `value` (and its name and role) in this browser.
 * @param {string} value
 * @param {MeDto} me
 */
export function keepToken(value, me) {
  localStorage.setItem(TOKEN_KEY, value);
  localStorage.setItem(ROLE_KEY, me.role);
  localStorage.setItem(NAME_KEY, me.name);
}

/** Forgets the token. */
export function forgetToken() {
  try {
    localStorage.removeItem(TOKEN_KEY);
    localStorage.removeItem(ROLE_KEY);
    localStorage.removeItem(NAME_KEY);
  } catch {
    // Storage refused: nothing was kept.
  }
}

/** @returns {string | null} the name of the kept token, as found at sign-in. */
export function tokenName() {
  return localStorage.getItem(NAME_KEY);
}

/** @returns {Role | null} the role of the kept token, as found at sign-in. */
export function role() {
  const r = localStorage.getItem(ROLE_KEY);
  return r === 'admin' || r === 'member' || r === 'viewer' ? r : null;
}

/**
 * Whether the kept token has at least `needed`.
 * @param {Role} needed
 */
export function can(needed) {
  const order = ['viewer', 'member', 'admin'];
  const r = role();
  return r !== null && order.indexOf(r) >= order.indexOf(needed);
}

/** @type {(message: string) => void} */
let onUnauthenticated = () => {};

/**
 * What to do when the API answers 401 (the app shows the sign-in prompt).
 * @param {(message: string) => void} handler
 */
export function whenUnauthenticated(handler) {
  onUnauthenticated = handler;
}

/**
 * @typedef {object} RequestOptions
 * @property {string} [method]
 * @property {unknown} [body] sent as JSON
 * @property {AbortSignal} [signal]
 * @property {string} [tokenOverride] a token to try instead of the kept one
 */

/**
 * A raw request to the API with the token.
 * @param {string} path starting with /api/
 * @param {RequestOptions} [options]
 * @returns {Promise<Response>}
 */
async function send(path, options = {}) {
  /** @type {Record<string, string>} */
  const headers = { Accept: 'application/json' };
  const t = options.tokenOverride ?? token();
  if (t) headers.Authorization = `Bearer ${t}`;
  /** @type {RequestInit} */
  const init = { method: options.method ?? 'GET', headers, signal: options.signal };
  if (options.body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(options.body);
  }
  try {
    return await fetch(apiBase() + path, init);
  } catch (e) {
    if (e instanceof DOMException && e.name === 'AbortError') throw e;
    throw new ApiError(0, 'network', 'The API could not be reached.');
  }
}

/**
 * The error of a non-2xx answer; a 401 on the kept token also forgets it and asks again.
 * @param {Response} res
 * @param {RequestOptions} options
 * @returns {Promise<ApiError>}
 */
async function failure(res, options) {
  let code = 'http_' + res.status;
  let message = `The API answered ${res.status}.`;
  try {
    const body = await res.json();
    if (body && body.error && typeof body.error.message === 'string') {
      code = String(body.error.code);
      message = body.error.message;
    }
  } catch {
    // Not the JSON envelope: keep the status.
  }
  if (res.status === 401 && options.tokenOverride === undefined) {
    forgetToken();
    onUnauthenticated('The API refused the token: ' + message);
  }
  return new ApiError(res.status, code, message);
}

/**
 * A JSON request; resolves to the parsed answer, rejects with {@link ApiError}.
 * @template T
 * @param {string} path
 * @param {RequestOptions} [options]
 * @returns {Promise<T>}
 */
export async function api(path, options = {}) {
  const res = await send(path, options);
  if (!res.ok) throw await failure(res, options);
  // 204 No Content (a revoked token, a deleted secret) has no body.
  const text = await res.text();
  if (!text) return /** @type {T} */ (/** @type {unknown} */ (null));
  try {
    return /** @type {T} */ (JSON.parse(text));
  } catch {
    throw new ApiError(res.status, 'invalid_answer', 'The API answered something that is not JSON.');
  }
}

/**
 * A plain-text answer (a task's log), or null on 404.
 * @param {string} path
 * @param {RequestOptions} [options]
 * @returns {Promise<{text: string, truncated: boolean} | null>}
 */
export async function apiText(path, options = {}) {
  const res = await send(path, options);
  if (res.status === 404) return null;
  if (!res.ok) throw await failure(res, options);
  return {
    text: await res.text(),
    truncated: res.headers.get('X-Agentry-Log-Truncated') === 'true',
  };
}

/**
 * The name and role of `candidate` (`GET /api/me`). Rejects with the API's 401 when the
 * token is refused.
 * @param {string} candidate
 * @returns {Promise<MeDto>}
 */
export async function whoIs(candidate) {
  const res = await send('/api/me', { tokenOverride: candidate });
  if (!res.ok) throw await failure(res, { tokenOverride: candidate });
  /** @type {MeDto} */
  const me = await res.json();
  return me;
}
