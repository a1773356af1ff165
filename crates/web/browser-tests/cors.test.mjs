// The same files served from a second origin reach the API through AGENTRY_CORS_ORIGINS.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startService, startStaticHost, fixtureTasks, launch, signIn, cents } from './harness.mjs';

/** @type {import('./harness.mjs').Stack} */
let stack;
/** @type {{origin: string, close: () => Promise<void>}} */
let allowed;
/** @type {{origin: string, close: () => Promise<void>}} */
let other;
/** @type {import('playwright-core').Browser} */
let browser;

before(async () => {
  let api = '';
  allowed = await startStaticHost(() => api);
  other = await startStaticHost(() => api);
  const waiting = {
    title: 'Queued elsewhere',
    repoUrl: 'https://github.com/acme/web',
    taskType: 'coding',
    state: 'queued',
    agentType: 'claude-code',
    inputTokens: 0,
    outputTokens: 0,
    createdAt: new Date(Date.now() - 60000).toISOString(),
  };
  stack = await startService({ tasks: [...fixtureTasks(40), waiting], env: { AGENTRY_CORS_ORIGINS: allowed.origin } });
  api = stack.base;
  browser = await launch();
});

after(async () => {
  await browser?.close();
  await stack?.stop();
  await allowed?.close();
  await other?.close();
});

test('the pages work from a second origin listed in AGENTRY_CORS_ORIGINS', { timeout: 60000 }, async () => {
  assert.notEqual(new URL(allowed.origin).port, new URL(stack.base).port);
  const page = await browser.newPage();
  /** @type {string[]} */
  const origins = [];
  page.on('request', (req) => {
    if (req.url().includes('/api/')) origins.push(new URL(req.url()).origin);
  });
  await signIn(page, `${allowed.origin}/costs?days=7`, stack.tokens.member);
  await page.locator('main[data-ready="days=7&repoUrl="]').waitFor();
  const r = await stack.api('/api/analytics/costs?days=7');
  const total = await page.getByRole('region', { name: 'Total cost', exact: true }).locator('.value').innerText();
  assert.equal(total, cents(r.summary.totalCost, { total: true }));
  assert.ok(origins.length > 0 && origins.every((o) => o === stack.base), origins.join(' '));
  // A page of the other origin's own paths, and a write (cancel) across origins.
  const queued = (await stack.api('/api/tasks?state=queued&limit=1')).tasks[0];
  await page.goto(`${allowed.origin}/tasks/${queued.id}`);
  await page.locator('main[data-ready="task:queued"]').waitFor();
  await page.getByRole('button', { name: 'Cancel' }).click();
  await page.locator('main[data-ready="task:cancelled"]').waitFor();
  assert.equal((await stack.api(`/api/tasks/${queued.id}`)).state, 'cancelled');
  await page.close();
});

test('an origin that is not listed cannot use the API', { timeout: 60000 }, async () => {
  const page = await browser.newPage();
  await page.goto(`${other.origin}/costs`);
  const dialog = page.getByRole('dialog', { name: 'Sign in' });
  await dialog.getByLabel('API token').fill(stack.tokens.viewer);
  await dialog.getByRole('button', { name: 'Sign in' }).click();
  await dialog.getByRole('alert').filter({ hasText: 'could not be reached' }).waitFor();
  await page.close();
});
