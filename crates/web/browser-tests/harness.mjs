// The stack the browser tests drive: the real `agentry` binary on a fresh data directory
// filled by `agentry import`, optionally the fake GitHub, and headless Chromium.
//
// Environment: AGENTRY_BIN (the binary), FAKE_GITHUB_BIN (the fake's `serve` example),
// CHROMIUM (default /usr/bin/chromium), SCREENSHOT_DIR (default <repo>/artifacts/screenshots).
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, writeFileSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
export const webDir = path.join(here, '..');
export const repoRoot = path.join(webDir, '..', '..');

const BIN = process.env.AGENTRY_BIN ?? path.join(repoRoot, 'target', 'debug', 'agentry');
const FAKE = process.env.FAKE_GITHUB_BIN ?? '';
export const SCREENSHOTS = process.env.SCREENSHOT_DIR ?? path.join(repoRoot, 'artifacts', 'screenshots');

/**
 * Polls `check` until it returns a truthy value or `ms` pass.
 * @template T
 * @param {() => Promise<T> | T} check
 * @param {string} what
 * @param {number} [ms]
 * @returns {Promise<T>}
 */
export async function until(check, what, ms = 10000) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      const v = await check();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${last}` : ''}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * Deterministic historical tasks (JSON Lines records of `agentry import`) over the last
 * `days` days: three repositories, three models, both task types, four states, some without
 * a cost, and one costing more than $1,000 (grouping) with 9 decimals (exactness).
 * @param {number} [days]
 */
export function fixtureTasks(days = 100) {
  const repos = ['https://github.com/acme/web', 'https://github.com/acme/api', 'https://github.com/acme/docs'];
  const models = ['claude-sonnet-4-5', 'claude-opus-4-1', 'claude-haiku-4-5'];
  const states = ['completed', 'pr_opened', 'failed', 'completed', 'cancelled', 'completed'];
  const now = Date.now();
  const lines = [];
  let seed = 7;
  const rand = () => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed / 2147483648;
  };
  let n = 0;
  for (let d = 0; d < days; d += 1) {
    const perDay = 1 + Math.floor(rand() * 3);
    for (let k = 0; k < perDay; k += 1) {
      n += 1;
      const repo = repos[Math.floor(rand() * (d < 10 ? 2 : 3))];
      const model = models[n % 3];
      const taskType = n % 4 === 0 ? 'review' : 'coding';
      const cents = Math.floor(rand() * 400000) + 1000;
      const cost = n % 11 === 0 ? null : `${Math.floor(cents / 100000)}.${String(cents % 100000).padStart(5, '0')}`;
      lines.push({
        title: `${taskType === 'review' ? 'Review: ' : ''}Task ${n} of ${repo.split('/').pop()}`,
        repoUrl: repo,
        taskType,
        state: states[n % states.length],
        agentType: 'claude-code',
        modelUsed: model,
        costUsd: cost,
        inputTokens: 1000 + Math.floor(rand() * 900000),
        outputTokens: 100 + Math.floor(rand() * 90000),
        createdAt: new Date(now - d * 86400000 - 120000 - k * 1000).toISOString(),
      });
    }
  }
  lines.push({
    title: 'Rewrite the billing module',
    repoUrl: repos[0],
    taskType: 'coding',
    state: 'failed',
    agentType: 'claude-code',
    modelUsed: 'claude-opus-4-1',
    costUsd: '1234.567891234',
    inputTokens: 98765432,
    outputTokens: 1234567,
    createdAt: new Date(now - 3 * 86400000).toISOString(),
  });
  return lines;
}

/**
 * Starts the fake GitHub (its `serve` example); resolves to its base URL and token.
 * @returns {Promise<{baseUrl: string, token: string, stop: () => void}>}
 */
export async function startFakeGitHub() {
  if (!FAKE) throw new Error('FAKE_GITHUB_BIN is not set');
  const child = spawn(FAKE, [], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = createInterface({ input: /** @type {any} */ (child.stdout) });
  const first = await new Promise((resolve, reject) => {
    lines.once('line', resolve);
    child.once('exit', (code) => reject(new Error(`the fake GitHub exited (${code})`)));
  });
  const info = JSON.parse(/** @type {string} */ (first));
  return { baseUrl: info.baseUrl, token: info.token, stop: () => child.stdin?.end() };
}

/**
 * @typedef {object} Stack
 * @property {string} base the service's origin, http://127.0.0.1:PORT
 * @property {{admin: string, member: string, viewer: string}} tokens
 * @property {(path: string, init?: {method?: string, body?: unknown, token?: string}) => Promise<any>} api
 * @property {() => Promise<void>} stop
 * @property {string} dataDir
 */

/**
 * Starts `agentry serve` on a fresh data directory holding `tasks`, with a token of each
 * role, no agent runs, and the given extra environment.
 * @param {{tasks?: object[], env?: Record<string, string>}} [options]
 * @returns {Promise<Stack>}
 */
export async function startService(options = {}) {
  const dataDir = mkdtempSync(path.join(tmpdir(), 'agentry-web-'));
  const env = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: process.env.HOME ?? dataDir,
    AGENTRY_DATA_DIR: path.join(dataDir, 'data'),
    AGENTRY_BIND: '127.0.0.1:0',
    AGENTRY_MAX_CONCURRENT_RUNS: '0',
    AGENTRY_LOG_FORMAT: 'pretty',
    RUST_LOG: 'warn,agentry_api::server=info',
    ...(options.env ?? {}),
  };
  if (options.tasks && options.tasks.length > 0) {
    const file = path.join(dataDir, 'tasks.jsonl');
    writeFileSync(file, options.tasks.map((t) => JSON.stringify(t)).join('\n') + '\n');
    execFileSync(BIN, ['import', file], { env, stdio: ['ignore', 'ignore', 'inherit'] });
  }
  /** @param {string} role */
  const token = (role) =>
    execFileSync(BIN, ['token', 'create', '--role', role, '--name', `browser ${role}`], { env, encoding: 'utf8' })
      .split(/\s+/)
      .find((w) => w.startsWith('agt_')) ?? '';
  const tokens = { admin: token('admin'), member: token('member'), viewer: token('viewer') };
  const child = spawn(BIN, ['serve'], { env, stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const base = await new Promise((resolve, reject) => {
    const lines = createInterface({ input: /** @type {any} */ (child.stderr) });
    lines.on('line', (line) => {
      log += line + '\n';
      const m = /agentry listening on (http:\/\/[0-9.:]+)/.exec(line);
      if (m) resolve(m[1]);
    });
    child.once('exit', (code) => reject(new Error(`agentry serve exited (${code}):\n${log}`)));
  });
  /** @type {Stack['api']} */
  const api = async (p, init = {}) => {
    const res = await fetch(base + p, {
      method: init.method ?? 'GET',
      headers: {
        Authorization: `Bearer ${init.token ?? tokens.admin}`,
        ...(init.body !== undefined ? { 'Content-Type': 'application/json' } : {}),
      },
      body: init.body !== undefined ? JSON.stringify(init.body) : undefined,
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`${init.method ?? 'GET'} ${p}: ${res.status} ${text}`);
    return text ? JSON.parse(text) : null;
  };
  const stop = async () => {
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    await exited;
    rmSync(dataDir, { recursive: true, force: true });
  };
  return { base: /** @type {string} */ (base), tokens, api, stop, dataDir };
}

/** Headless Chromium (Debian's; browsers are never downloaded). */
export async function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox'],
  });
}

/**
 * Opens `url` in `page` and signs in with `token` through the prompt.
 * @param {import('playwright-core').Page} page
 * @param {string} url
 * @param {string} token
 */
export async function signIn(page, url, token) {
  await page.goto(url);
  const dialog = page.getByRole('dialog', { name: 'Sign in' });
  await dialog.getByLabel('API token').fill(token);
  await dialog.getByRole('button', { name: 'Sign in' }).click();
  await dialog.waitFor({ state: 'hidden' });
}

/**
 * Saves a full-page screenshot as SCREENSHOT_DIR/name.png.
 * @param {import('playwright-core').Page} page
 * @param {string} name
 */
export async function screenshot(page, name) {
  mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: path.join(SCREENSHOTS, `${name}.png`), fullPage: true });
}

const AXE = readFileSync(path.join(webDir, 'node_modules', 'axe-core', 'axe.min.js'), 'utf8');

/**
 * The serious and critical axe-core violations of the page as it is (axe is evaluated in
 * the page by the test; the service never serves it).
 * @param {import('playwright-core').Page} page
 * @returns {Promise<string[]>}
 */
export async function axeViolations(page) {
  await page.evaluate(AXE);
  const results = await page.evaluate(async () => {
    // @ts-ignore axe is the script just evaluated
    const r = await window.axe.run(document, { resultTypes: ['violations'] });
    return r.violations.map((/** @type {any} */ v) => ({
      id: v.id,
      impact: v.impact,
      help: v.help,
      nodes: v.nodes.map((/** @type {any} */ n) => n.target.join(' ')).slice(0, 5),
    }));
  });
  return results
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => `${v.impact} ${v.id}: ${v.help} at ${v.nodes.join(', ')}`);
}

/**
 * Money as the page shows it, from the API's exact text: `$1,234.5678`.
 * @param {string | number} v
 */
export function usd(v) {
  const text = String(v);
  const [int, frac] = text.replace('-', '').split('.');
  const grouped = int.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  return `${text.startsWith('-') ? '−' : ''}$${grouped}${frac !== undefined ? '.' + frac : ''}`;
}

/**
 * Money as the page shows it outside the data tables: the API's exact text rounded half up
 * to the cent (computed here on the digits with BigInt, independently of the page), a total
 * of $1,000 or more to the dollar: `$1,234.57`, `$433,740`.
 * @param {string | number} v
 * @param {{total?: boolean}} [options]
 */
export function cents(v, options = {}) {
  let text = String(v);
  const e = /^(-?\d+(?:\.\d+)?)e([+-]\d+)$/.exec(text);
  if (e) text = Number(v).toFixed(20).replace(/0+$/, '');
  const negative = text.startsWith('-');
  const [int, frac = ''] = text.replace('-', '').split('.');
  const places = options.total && int.length >= 4 ? 0 : 2;
  const scaled = BigInt(int + frac.padEnd(places + 1, '0').slice(0, places + 1));
  const rounded = (scaled + 5n) / 10n;
  const digits = rounded.toString().padStart(places + 1, '0');
  const whole = digits.slice(0, digits.length - places);
  const decimals = places ? '.' + digits.slice(digits.length - places) : '';
  const grouped = whole.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  const zero = /^[0.]+$/.test(whole + decimals.slice(1));
  return `${negative && !zero ? '−' : ''}$${grouped}${decimals}`;
}

/** A money text with more than two decimals (the page shows none outside closed data tables). */
export const OVER_PRECISE = /\$[0-9,]+\.[0-9]{3,}/;

const TYPES = {
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.html': 'text/html; charset=utf-8',
};

/**
 * A static host on another origin serving the same files as the binary (the shell for every
 * page path, the assets under /assets/), with the shell's API base set to `apiBase()` and a
 * policy that lets the page reach that API, as a team's own deployment would.
 * @param {() => string} apiBase
 * @returns {Promise<{origin: string, close: () => Promise<void>}>}
 */
export async function startStaticHost(apiBase) {
  const { createServer } = await import('node:http');
  const server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://host');
    const asset = /^\/assets\/([a-z-]+\.(?:js|css|svg))$/.exec(url.pathname);
    if (asset) {
      try {
        const body = readFileSync(path.join(webDir, 'assets', asset[1]));
        res.writeHead(200, { 'Content-Type': TYPES[/** @type {'.js'} */ (path.extname(asset[1]))] });
        res.end(body);
      } catch {
        res.writeHead(404).end();
      }
      return;
    }
    const shell = readFileSync(path.join(webDir, 'index.html'), 'utf8').replace(
      '<meta name="agentry-api-base" content="">',
      `<meta name="agentry-api-base" content="${apiBase()}">`,
    );
    res.writeHead(200, {
      'Content-Type': TYPES['.html'],
      'Content-Security-Policy': `default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self' ${apiBase()}; base-uri 'none'; form-action 'self'; frame-ancestors 'none'`,
    });
    res.end(shell);
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', () => r(undefined)));
  const address = /** @type {import('node:net').AddressInfo} */ (server.address());
  return {
    origin: `http://127.0.0.1:${address.port}`,
    close: () => new Promise((r) => server.close(() => r(undefined))),
  };
}
