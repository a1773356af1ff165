// /costs, sign-in and /tasks/{id} in Chromium against the real binary on imported tasks.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startService, fixtureTasks, launch, signIn, screenshot, axeViolations, usd, until } from './harness.mjs';

/** @type {import('./harness.mjs').Stack} */
let stack;
/** @type {import('playwright-core').Browser} */
let browser;

before(async () => {
  stack = await startService({ tasks: fixtureTasks() });
  browser = await launch();
});

after(async () => {
  await browser?.close();
  await stack?.stop();
});

/** @param {import('playwright-core').Page} page @param {string} name */
const region = (page, name) => page.getByRole('region', { name, exact: true });

/**
 * Matches the cost-report requests of `days`.
 * @param {number} days
 */
const costsOf = (days) => (/** @type {URL} */ url) => url.pathname === '/api/analytics/costs' && url.searchParams.get('days') === String(days);

/** @param {string} url */
const repoName = (url) => url.replace(/^https:\/\/[^/]+\//, '');

/**
 * The report the API gives for these filters.
 * @param {number} days
 * @param {string} [repoUrl]
 */
async function report(days, repoUrl) {
  const q = new URLSearchParams({ days: String(days) });
  if (repoUrl) q.set('repoUrl', repoUrl);
  return stack.api(`/api/analytics/costs?${q}`, { token: stack.tokens.viewer });
}

/**
 * Waits for the page to show the report of these filters, then checks every card, chart,
 * notice and the table against the API's answer.
 * @param {import('playwright-core').Page} page
 * @param {number} days
 * @param {string} repoUrl
 */
async function expectReport(page, days, repoUrl) {
  await page.locator(`main[data-ready="days=${days}&repoUrl=${repoUrl}"]`).waitFor();
  const r = await report(days, repoUrl);
  const value = (/** @type {string} */ name) => region(page, name).locator('.value').innerText();
  assert.equal(await value('Total cost'), usd(r.summary.totalCost));
  assert.equal(await value('Task count'), r.summary.tasksWithCost.toLocaleString('en-US'));
  assert.equal(await value('Average cost'), usd(r.summary.avgCost));
  const trend = await value('Cost trend');
  const sign = r.summary.costTrend.startsWith('-') ? '' : r.summary.costTrend === '0.0' ? '' : '+';
  assert.ok(trend.includes(`${sign}${r.summary.costTrend.replace('-', '−')}%`), `${trend} vs ${r.summary.costTrend}`);
  assert.ok((await region(page, 'Cost trend').innerText()).includes(usd(r.summary.prevPeriodCost)));
  const forecast = await region(page, 'Forecast').innerText();
  assert.ok(forecast.includes(usd(r.forecast.monthCostSoFar)), forecast);
  assert.ok(forecast.includes(usd(r.forecast.forecastedMonthTotal)), forecast);
  assert.equal(await region(page, 'Anomalies').locator('li').count(), r.anomalies.length);
  assert.equal(await region(page, 'Model suggestions').locator('li').count(), r.modelSuggestions.length);
  // Charts: an image with a text alternative, and the data behind it.
  const daily = region(page, 'Daily costs');
  assert.match((await daily.getByRole('img').getAttribute('aria-label')) ?? '', new RegExp(`over ${days} UTC days`));
  assert.equal(await daily.locator('tbody tr').count(), days);
  const dailyRows = await daily.locator('tbody tr').allTextContents();
  r.dailyCosts.forEach((/** @type {any} */ d, /** @type {number} */ i) => {
    assert.ok(dailyRows[i].startsWith(d.date) && dailyRows[i].includes(usd(d.cost)), `${dailyRows[i]} vs ${JSON.stringify(d)}`);
  });
  const repos = region(page, 'Cost by repository');
  assert.equal(await repos.locator('rect.bar').count(), Math.min(12, r.costByRepo.length));
  assert.deepEqual(
    await repos.locator('tbody th').allTextContents(),
    r.costByRepo.map((/** @type {any} */ c) => repoName(c.repoUrl)),
  );
  const types = await region(page, 'Cost by task type').locator('.pie-legend li').allTextContents();
  assert.deepEqual(
    types.map((t) => t.split(':')[0]),
    r.costByType.map((/** @type {any} */ t) => t.taskType),
  );
  r.costByType.forEach((/** @type {any} */ t, /** @type {number} */ i) => assert.ok(types[i].includes(usd(t.totalCost)), types[i]));
  // The table of the ten costliest tasks.
  const rows = region(page, 'Most expensive tasks').locator('tbody tr');
  assert.equal(await rows.count(), r.topTasks.length);
  for (let i = 0; i < r.topTasks.length; i += 1) {
    const cells = await rows.nth(i).locator('th, td').allInnerTexts();
    const t = r.topTasks[i];
    assert.equal(cells[0], t.title);
    assert.equal(cells[1], repoName(t.repoUrl));
    assert.equal(cells[2], t.taskType);
    assert.equal(cells[4], t.modelUsed);
    assert.equal(cells[5], t.inputTokens.toLocaleString('en-US'));
    assert.equal(cells[6], t.outputTokens.toLocaleString('en-US'));
    assert.equal(cells[7], usd(t.costUsd));
  }
  return r;
}

test('sign-in: the prompt asks for a token once, refuses a wrong one, and sign-out brings it back', { timeout: 60000 }, async () => {
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.goto(`${stack.base}/costs`);
  const dialog = page.getByRole('dialog', { name: 'Sign in' });
  await dialog.waitFor();
  await dialog.getByLabel('API token').fill('agt_not-a-real-token');
  await dialog.getByRole('button', { name: 'Sign in' }).click();
  await dialog.getByRole('alert').filter({ hasText: 'refused' }).waitFor();
  await dialog.getByLabel('API token').fill(stack.tokens.viewer);
  await dialog.getByRole('button', { name: 'Sign in' }).click();
  await dialog.waitFor({ state: 'hidden' });
  await expectReport(page, 30, '');
  // The token is kept: a new page of the same browser needs no sign-in.
  const again = await context.newPage();
  await again.goto(`${stack.base}/costs?days=7`);
  await expectReport(again, 7, '');
  assert.equal(await again.getByRole('dialog', { name: 'Sign in' }).isVisible(), false);
  await again.getByRole('button', { name: 'Sign out' }).click();
  await again.getByRole('dialog', { name: 'Sign in' }).waitFor();
  assert.equal(await again.evaluate(() => localStorage.getItem('agentry.token')), null);
  await context.close();
});

test('every card, chart, notice and the table show the API numbers; screenshot and axe', { timeout: 60000 }, async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await signIn(page, `${stack.base}/costs`, stack.tokens.viewer);
  const r = await expectReport(page, 30, '');
  assert.ok(r.summary.tasksWithCost > 10 && r.topTasks.length === 10);
  // Money keeps the API's exact digits, grouped: the $1,234.567891234 task is the first row.
  assert.equal(r.topTasks[0].costUsd, '1234.567891234');
  assert.ok((await region(page, 'Most expensive tasks').innerText()).includes('$1,234.567891234'));
  // Labelled filters.
  assert.equal(await page.getByLabel('Period', { exact: true }).inputValue(), '30');
  assert.equal(await page.getByLabel('Repository', { exact: true }).inputValue(), '');
  // Keyboard: a chart takes focus, End shows the last day's exact values, announced.
  const daily = region(page, 'Daily costs');
  await daily.getByRole('img').focus();
  await page.keyboard.press('End');
  const last = r.dailyCosts[r.dailyCosts.length - 1];
  const said = await daily.locator('[aria-live]').innerText();
  assert.ok(said.includes(last.date) && said.includes(usd(last.cost)), said);
  assert.ok(await page.locator('#tooltip').isVisible());
  await page.keyboard.press('Home');
  assert.ok((await daily.locator('[aria-live]').innerText()).includes(r.dailyCosts[0].date));
  await page.keyboard.press('Escape');
  await screenshot(page, 'costs');
  assert.deepEqual(await axeViolations(page), []);
  await page.close();
});

test('switching period and repository refreshes every widget from one request; the URL keeps the filters', { timeout: 60000 }, async () => {
  const page = await browser.newPage();
  await signIn(page, `${stack.base}/costs`, stack.tokens.viewer);
  await expectReport(page, 30, '');
  /** @type {string[]} */
  const requests = [];
  page.on('request', (req) => {
    if (req.url().includes('/api/')) requests.push(req.url().replace(stack.base, ''));
  });
  await page.getByLabel('Period', { exact: true }).selectOption('7');
  await expectReport(page, 7, '');
  assert.deepEqual(requests, ['/api/analytics/costs?days=7']);
  assert.equal(new URL(page.url()).search, '?days=7');
  const repoUrl = 'https://github.com/acme/api';
  await page.getByLabel('Repository', { exact: true }).selectOption(repoUrl);
  const r = await expectReport(page, 7, repoUrl);
  assert.ok(r.costByRepo.length === 1);
  assert.equal(new URL(page.url()).searchParams.get('repoUrl'), repoUrl);
  // Keyboard: the period can be changed from the keyboard alone.
  await page.getByLabel('Period', { exact: true }).focus();
  await page.keyboard.press('ArrowDown');
  await expectReport(page, 14, repoUrl);
  // Back and forward walk the filters; a shared link opens them.
  await page.goBack();
  await expectReport(page, 7, repoUrl);
  assert.equal(await page.getByLabel('Repository', { exact: true }).inputValue(), repoUrl);
  await page.goBack();
  await expectReport(page, 7, '');
  await page.goForward();
  await expectReport(page, 7, repoUrl);
  const shared = await browser.newPage();
  await signIn(shared, `${stack.base}/costs?days=90&repoUrl=${encodeURIComponent(repoUrl)}`, stack.tokens.viewer);
  await expectReport(shared, 90, repoUrl);
  assert.equal(await shared.getByLabel('Period', { exact: true }).inputValue(), '90');
  assert.equal(await shared.getByLabel('Repository', { exact: true }).inputValue(), repoUrl);
  await shared.close();
  await page.close();
});

test('a slow first answer does not overwrite the second', { timeout: 60000 }, async () => {
  const page = await browser.newPage();
  await signIn(page, `${stack.base}/costs?days=14`, stack.tokens.viewer);
  await expectReport(page, 14, '');
  /** @type {() => void} */
  let release = () => {};
  const released = new Promise((r) => {
    release = () => r(undefined);
  });
  /** @type {() => void} */
  let answered = () => {};
  const delivered = new Promise((r) => {
    answered = () => r(undefined);
  });
  let slow = false;
  // The first answer (30 days) is held until the second (7 days) is on the page.
  await page.route(costsOf(30), async (route) => {
    slow = true;
    const response = await route.fetch();
    await released;
    // The page may have given up on it (aborted): then there is nothing to deliver.
    await route.fulfill({ response }).catch(() => {});
    answered();
  });
  try {
    await page.getByLabel('Period', { exact: true }).selectOption('30');
    await until(() => slow, 'the slow request');
    await page.getByLabel('Period', { exact: true }).selectOption('7');
    await expectReport(page, 7, '');
  } finally {
    release();
  }
  await delivered;
  // Let the page run whatever the late answer scheduled, then look again.
  await page.evaluate(() => new Promise((r) => setTimeout(() => requestAnimationFrame(() => r(undefined)), 0)));
  await expectReport(page, 7, '');
  assert.equal(await page.getByLabel('Period', { exact: true }).inputValue(), '7');
  await page.close();
});

test('a top-task row opens its detail page; a viewer sees no actions, a member no Retry for imported history', { timeout: 60000 }, async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await signIn(page, `${stack.base}/costs`, stack.tokens.viewer);
  const r = await expectReport(page, 30, '');
  const top = r.topTasks[0];
  // A click anywhere on the row (here its cost cell) opens the task.
  await region(page, 'Most expensive tasks').locator('tbody tr').first().locator('td').last().click();
  await page.waitForURL(`${stack.base}/tasks/${top.id}`);
  await page.locator('main[data-ready^="task:"]').waitFor();
  assert.equal(await page.getByRole('heading', { level: 1 }).innerText(), top.title);
  const fields = await page.locator('dl.fields').innerText();
  assert.ok(fields.includes(usd(top.costUsd)), fields);
  assert.ok(fields.includes('98,765,432'), fields);
  // Times in the browser's zone, UTC in the tooltip.
  const created = page.locator('dl.fields time').first();
  assert.match((await created.getAttribute('title')) ?? '', /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$/);
  assert.ok(await region(page, 'State history').innerText());
  assert.equal(await page.getByRole('button', { name: 'Retry' }).count(), 0);
  assert.equal(await page.getByRole('button', { name: 'Cancel' }).count(), 0);
  await screenshot(page, 'task');
  assert.deepEqual(await axeViolations(page), []);
  await page.close();

  // The fixture is imported history: a member sees why it has no Retry (the API refuses one,
  // contract 3.9); retrying and cancelling a task of this service are in codehost.test.mjs.
  const member = await browser.newPage();
  await signIn(member, `${stack.base}/tasks/${top.id}`, stack.tokens.member);
  await member.locator('main[data-ready="task:failed"]').waitFor();
  assert.ok((await member.locator('dl.fields').innerText()).includes('Imported history'));
  assert.equal(await member.getByRole('button', { name: 'Retry' }).count(), 0);
  const refused = await fetch(`${stack.base}/api/tasks/${top.id}/retry`, {
    method: 'POST',
    headers: { authorization: `Bearer ${stack.tokens.member}` },
  });
  assert.equal(refused.status, 409);
  assert.equal((await stack.api(`/api/tasks/${top.id}`)).state, 'failed');
  await member.close();
});

test('a 401 brings the prompt back', { timeout: 60000 }, async () => {
  const created = await stack.api('/api/tokens', { method: 'POST', body: { name: 'short-lived', role: 'viewer' } });
  const page = await browser.newPage();
  await signIn(page, `${stack.base}/costs`, created.token);
  await expectReport(page, 30, '');
  await stack.api(`/api/tokens/${created.id}`, { method: 'DELETE' });
  await page.getByLabel('Period', { exact: true }).selectOption('7');
  const dialog = page.getByRole('dialog', { name: 'Sign in' });
  await dialog.waitFor();
  assert.match(await dialog.getByRole('alert').innerText(), /refused/);
  await dialog.getByLabel('API token').fill(stack.tokens.viewer);
  await dialog.getByRole('button', { name: 'Sign in' }).click();
  await expectReport(page, 7, '');
  await page.close();
});

test('the empty state and the error state', { timeout: 60000 }, async () => {
  const page = await browser.newPage();
  await signIn(page, `${stack.base}/costs?repoUrl=${encodeURIComponent('https://github.com/acme/none')}`, stack.tokens.viewer);
  await page.locator('main[data-ready="days=30&repoUrl=https://github.com/acme/none"]').waitFor();
  await page.getByText('No tasks in this period.').waitFor();
  await page.route(costsOf(7), (route) =>
    route.fulfill({ status: 503, contentType: 'application/json', body: '{"error":{"code":"unavailable","message":"the database is not answering"}}' }),
  );
  await page.getByLabel('Period', { exact: true }).selectOption('7');
  await page.locator('main[data-ready="error"]').waitFor();
  await page.getByRole('status').filter({ hasText: 'the database is not answering' }).waitFor();
  await page.close();
});
