// /settings without a code host: the instance's monthly budget (read by every role, set by
// an admin) and the budget alerts of this month.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startService, fixtureTasks, launch, signIn, screenshot, axeViolations, OVER_PRECISE } from './harness.mjs';

/** @type {import('./harness.mjs').Stack} */
let stack;
/** @type {import('playwright-core').Browser} */
let browser;

before(async () => {
  stack = await startService({ tasks: fixtureTasks(20) });
  browser = await launch();
});

after(async () => {
  await browser?.close();
  await stack?.stop();
});

/** @param {import('playwright-core').Page} page @param {string} name */
const region = (page, name) => page.getByRole('region', { name, exact: true });

test('settings: an admin sets and removes the monthly budget; bad input shows the API message', { timeout: 60000 }, async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await signIn(page, `${stack.base}/settings`, stack.tokens.admin);
  await page.locator('main[data-ready="settings"]').waitFor();
  const budget = region(page, 'Monthly budget');
  assert.match(await budget.locator('dl').innerText(), /Budget\s+none/);
  const input = budget.getByLabel('Monthly budget (USD)');
  await input.fill('ten');
  await budget.getByRole('button', { name: 'Save budget' }).click();
  const refused = await budget.getByRole('alert').innerText();
  assert.match(refused, /^monthlyBudgetUsd/);
  assert.equal(await input.getAttribute('aria-invalid'), 'true');
  assert.equal((await stack.api('/api/budget')).monthlyBudgetUsd, null);

  await input.fill('500.125');
  await budget.getByRole('button', { name: 'Save budget' }).click();
  await budget.getByRole('status').filter({ hasText: 'Saved.' }).waitFor();
  assert.equal((await stack.api('/api/budget')).monthlyBudgetUsd, '500.125');
  const shown = budget.locator('dd .money').first();
  assert.equal(await shown.innerText(), '$500.13');
  assert.equal(await shown.getAttribute('title'), '$500.125');
  assert.match(await budget.locator('dl').innerText(), /Remaining\s+\$500\.13/);
  assert.doesNotMatch(await page.locator('body').innerText(), OVER_PRECISE);
  await screenshot(page, 'settings-budget');
  assert.deepEqual(await axeViolations(page), []);

  await budget.getByRole('button', { name: 'Remove budget' }).click();
  await budget.getByRole('status').filter({ hasText: 'removed' }).waitFor();
  assert.equal((await stack.api('/api/budget')).monthlyBudgetUsd, null);
  await page.close();
});

test('settings: a viewer reads the budget, cannot change it, and sees this month’s alerts only', { timeout: 60000 }, async () => {
  await stack.api('/api/budget', { method: 'PUT', body: { monthlyBudgetUsd: '40' } });
  const month = new Date().toISOString().slice(0, 7);
  const alert = (/** @type {number} */ threshold, /** @type {string} */ m, /** @type {string | null} */ repoUrl) => ({
    id: crypto.randomUUID(),
    scope: repoUrl ? 'repository' : 'instance',
    repoUrl,
    month: m,
    threshold,
    spentUsd: repoUrl ? '8.0123' : '40.5',
    monthlyBudgetUsd: repoUrl ? '10' : '40',
    createdAt: new Date().toISOString(),
    delivery: 'unsent',
    deliveryAttempts: 0,
    deliveredAt: null,
    lastError: null,
  });
  const page = await browser.newPage();
  // No run spends in this test: the alerts the API would list are given to the page.
  await page.route(
    (url) => url.pathname === '/api/budget/alerts',
    (route) =>
      route.fulfill({
        json: {
          alerts: [alert(100, month, null), alert(80, month, 'https://github.com/acme/web'), alert(50, '2020-01', null)],
          nextCursor: null,
        },
      }),
  );
  try {
    await signIn(page, `${stack.base}/settings`, stack.tokens.viewer);
    await page.locator('main[data-ready="settings"]').waitFor();
    const budget = region(page, 'Monthly budget');
    assert.match(await budget.locator('dl').innerText(), /Budget\s+\$40\.00/);
    assert.equal(await budget.getByRole('button').count(), 0);
    assert.match(await budget.innerText(), /Only an admin/);
    const alerts = region(page, 'Budget alerts');
    const items = await alerts.locator('li').allInnerTexts();
    assert.equal(items.length, 2, items.join('\n'));
    assert.ok(items[0].startsWith('100 % reached · the instance: $40.50 of $40.00'), items[0]);
    assert.ok(items[1].startsWith('80 % reached · acme/web: $8.01 of $10.00'), items[1]);
    assert.deepEqual(await axeViolations(page), []);
  } finally {
    await page.close();
    await stack.api('/api/budget', { method: 'PUT', body: { monthlyBudgetUsd: null } });
  }
});
