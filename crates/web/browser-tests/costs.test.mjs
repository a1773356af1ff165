// /costs, sign-in and /tasks/{id} in Chromium against the real binary on imported tasks.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startService, fixtureTasks, launch, signIn, screenshot, axeViolations, usd, cents, OVER_PRECISE, until } from './harness.mjs';

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
 * Opens /costs (30 days) in a new page, signed in as the viewer, with the API's report
 * changed by `edit` on its way to the page; returns the page once it shows the report.
 * @param {(r: any) => void} edit
 */
async function costsPageWith(edit) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await page.route(costsOf(30), async (route) => {
    const response = await route.fetch();
    const r = await response.json();
    edit(r);
    await route.fulfill({ response, json: r });
  });
  await signIn(page, `${stack.base}/costs`, stack.tokens.viewer);
  await page.locator('main[data-ready="days=30&repoUrl="]').waitFor();
  return page;
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
  // Money to the cent (a total of $1,000 or more to the dollar), the exact value in the tooltip.
  assert.equal(await value('Total cost'), cents(r.summary.totalCost, { total: true }));
  assert.equal(await region(page, 'Total cost').locator('.value .money').getAttribute('title'), usd(r.summary.totalCost));
  assert.equal(await value('Task count'), r.summary.tasksWithCost.toLocaleString('en-US'));
  assert.equal(await value('Average cost'), cents(r.summary.avgCost));
  const trend = await value('Cost trend');
  const sign = r.summary.costTrend.startsWith('-') ? '' : r.summary.costTrend === '0.0' ? '' : '+';
  assert.ok(trend.includes(`${sign}${r.summary.costTrend.replace('-', '−')}%`), `${trend} vs ${r.summary.costTrend}`);
  assert.ok((await region(page, 'Cost trend').innerText()).includes(cents(r.summary.prevPeriodCost, { total: true })));
  const forecast = await region(page, 'Forecast').innerText();
  assert.ok(forecast.includes(cents(r.forecast.monthCostSoFar, { total: true })), forecast);
  assert.ok(forecast.includes(cents(r.forecast.forecastedMonthTotal, { total: true })), forecast);
  assert.equal(await region(page, 'Anomalies').locator('li').count(), r.anomalies.length);
  // Model suggestions: a table of the top three, the rest behind a disclosure.
  const suggestions = region(page, 'Model suggestions');
  assert.equal(await suggestions.locator('tbody tr').count(), r.modelSuggestions.length);
  assert.equal(await suggestions.locator('tbody tr:visible').count(), Math.min(3, r.modelSuggestions.length));
  assert.equal(await suggestions.locator('details').count(), r.modelSuggestions.length > 3 ? 1 : 0);
  // Outcomes: the report's figures, and one row per repository.
  const outcomes = region(page, 'Outcomes');
  const figures = await outcomes.locator('dl').innerText();
  assert.ok(figures.includes(`Merged pull requests\n${r.outcomes.mergedPullRequests.toLocaleString('en-US')}`), figures);
  if (r.outcomes.costPerMergedPullRequest !== null) assert.ok(figures.includes(cents(r.outcomes.costPerMergedPullRequest)), figures);
  assert.ok(figures.includes(cents(r.outcomes.failedCost, { total: true })), figures);
  assert.ok(figures.includes(`${r.outcomes.failedShare.toFixed(1)}%`), figures);
  assert.deepEqual(
    await outcomes.locator('tbody th').allTextContents(),
    r.outcomes.byRepo.map((/** @type {any} */ g) => repoName(g.repoUrl)),
  );
  // Nothing visible shows money with more than two decimals.
  const text = await page.locator('body').innerText();
  assert.doesNotMatch(text, OVER_PRECISE);
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
  r.costByType.forEach((/** @type {any} */ t, /** @type {number} */ i) => assert.ok(types[i].includes(cents(t.totalCost)), types[i]));
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
    assert.equal(cells[7], cents(t.costUsd));
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
  // Money to the cent, the exact digits in the tooltip: the $1,234.567891234 task is the first row.
  assert.equal(r.topTasks[0].costUsd, '1234.567891234');
  const first = region(page, 'Most expensive tasks').locator('tbody tr').first().locator('.money');
  assert.equal(await first.innerText(), '$1,234.57');
  assert.equal(await first.getAttribute('title'), '$1,234.567891234');
  // Labelled filters.
  assert.equal(await page.getByLabel('Period', { exact: true }).inputValue(), '30');
  assert.equal(await page.getByLabel('Repository', { exact: true }).inputValue(), '');
  // Keyboard: a chart takes focus, End shows the last day's exact values, announced.
  const daily = region(page, 'Daily costs');
  await daily.getByRole('img').focus();
  await page.keyboard.press('End');
  const last = r.dailyCosts[r.dailyCosts.length - 1];
  const said = await daily.locator('[aria-live]').innerText();
  assert.ok(said.includes(last.date) && said.includes(cents(last.cost)), said);
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
  assert.ok(fields.includes(cents(top.costUsd)), fields);
  assert.equal(await page.locator('dl.fields .money').first().getAttribute('title'), usd(top.costUsd));
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

test('the page asks /api/me for the role at sign-in, never probes', { timeout: 60000 }, async () => {
  for (const [role, token] of Object.entries(stack.tokens)) {
    const page = await browser.newPage();
    /** @type {string[]} */
    const requests = [];
    page.on('request', (req) => {
      if (req.url().includes('/api/')) requests.push(`${req.method()} ${new URL(req.url()).pathname}`);
    });
    await signIn(page, `${stack.base}/costs`, token);
    await expectReport(page, 30, '');
    assert.ok(requests.includes('GET /api/me'), requests.join(', '));
    assert.deepEqual(requests.filter((r) => r.includes('/api/tokens') || r.includes('/cancel')), [], requests.join(', '));
    assert.equal(await page.evaluate(() => localStorage.getItem('agentry.role')), role);
    assert.equal(await page.locator('#session-role').innerText(), `Signed in as browser ${role} (${role})`);
    // Another page of the same browser keeps the role: no request at all to learn it.
    requests.length = 0;
    await page.goto(`${stack.base}/settings`);
    await page.locator('main[data-ready="settings"]').waitFor();
    assert.deepEqual(requests.filter((r) => r.includes('/api/me') || r.includes('/cancel')), [], requests.join(', '));
    await page.close();
  }
});

test('Outcomes and Budgets from the API; a budget set in Settings shows on the page', { timeout: 60000 }, async () => {
  await stack.api('/api/budget', { method: 'PUT', body: { monthlyBudgetUsd: '2500.005' } });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    await signIn(page, `${stack.base}/costs`, stack.tokens.viewer);
    const r = await expectReport(page, 30, '');
    const budgets = region(page, 'Budgets');
    assert.equal(r.budgets.length, 1);
    const b = r.budgets[0];
    const text = await budgets.innerText();
    assert.ok(text.includes('Instance'), text);
    assert.ok(text.includes(`Month to date ${cents(b.monthToDateUsd, { total: true })} of ${cents(b.monthlyBudgetUsd, { total: true })}`), text);
    assert.ok(text.includes('under 80 %'), text);
    assert.equal(await budgets.getByRole('meter').count(), 1);
    // What a budget counts, and how much of the forecast's month is imported history: the
    // fixture is all imported, so the budget's month to date is $0.00 whatever the month holds.
    assert.equal(b.monthToDateUsd, '0.0000');
    assert.equal(r.forecast.monthImportedCostSoFar, r.forecast.monthCostSoFar);
    const counts = await budgets.locator('.budgets-count').innerText();
    const general = 'A budget counts what agentry’s own runs that finished this month (UTC) cost. Imported history is not counted.';
    if (/^0\.0+$/.test(r.forecast.monthImportedCostSoFar)) {
      // Only in the first minutes of a month, before any fixture task of it.
      assert.equal(counts, general);
    } else {
      const month = cents(r.forecast.monthCostSoFar, { total: true });
      assert.equal(counts, `${general} The forecast’s month so far, ${month}, includes ${month} of imported history, which no budget counts.`);
    }
    assert.deepEqual(await axeViolations(page), []);
    await page.close();
  } finally {
    await stack.api('/api/budget', { method: 'PUT', body: { monthlyBudgetUsd: null } });
  }
});

test('suggestions top three and a disclosure, budgets at 80 % and 100 % in words, revision figures when sent', { timeout: 60000 }, async () => {
  const month = new Date().toISOString().slice(0, 7);
  // The report as the API gives it, with five suggestions (the first the page once printed
  // with 16 decimals), three budgets (under 80 %, at 80 %, over) and the revision figures.
  const page = await costsPageWith((r) => {
    r.modelSuggestions = [0, 1, 2, 3, 4].map((i) => ({
      repoUrl: `https://github.com/acme/repo-${i}`,
      currentModel: 'claude-opus-4-1',
      taskCount: 682 - i,
      avgCost: 2.1464740601173022,
      cheaperModelAvgCost: 2.0069648099399235,
      suggestedModel: 'claude-sonnet-4-5',
      estimatedSavings: 95.14530682097214 - i,
    }));
    r.budgets = [
      { scope: 'instance', repoUrl: null, monthlyBudgetUsd: '500.0000', monthToDateUsd: '123.4567', forecastUsd: '456.7891', exhaustsOn: null },
      { scope: 'repository', repoUrl: 'https://github.com/acme/web', monthlyBudgetUsd: '100.0000', monthToDateUsd: '80.0000', forecastUsd: '140.1234', exhaustsOn: `${month}-27` },
      { scope: 'repository', repoUrl: 'https://github.com/acme/api', monthlyBudgetUsd: '10.0000', monthToDateUsd: '12.3456', forecastUsd: '30.0001', exhaustsOn: `${month}-02` },
    ];
    r.outcomes.revisionCost = '12.3456789';
    r.outcomes.avgRevisionsPerMergedPullRequest = 1.25;
    r.forecast.monthCostSoFar = '347.4512';
    r.forecast.monthImportedCostSoFar = '343.7049';
  });
  const suggestions = region(page, 'Model suggestions');
  const rows = suggestions.locator('tbody tr');
  assert.equal(await rows.count(), 5);
  assert.equal(await suggestions.locator('tbody tr:visible').count(), 3);
  assert.deepEqual(await rows.first().locator('th, td').allInnerTexts(), ['acme/repo-0', 'claude-opus-4-1', 'claude-sonnet-4-5', '682', '$95.15']);
  assert.equal(
    await rows.first().locator('.money').getAttribute('title'),
    '$95.14530682097214: $2.0069648099399235 instead of $2.1464740601173022 a task',
  );
  const more = suggestions.getByText('2 more suggestions');
  await more.click();
  assert.equal(await suggestions.locator('tbody tr:visible').count(), 5);

  const budgets = region(page, 'Budgets');
  const items = budgets.locator('li');
  assert.equal(await items.count(), 3);
  const [ok, warn, over] = await items.allInnerTexts();
  assert.ok(ok.includes('under 80 %') && ok.includes('Month to date $123.46 of $500.00 (24.7%)') && ok.includes('Forecast for the month: $456.79') && ok.includes('Lasts the month'), ok);
  assert.ok(warn.includes('80 % reached') && warn.includes('(80.0%)') && /Runs out on \w+ 27 \(UTC\)/.test(warn), warn);
  assert.ok(over.includes('over budget') && over.includes('(123.5%)'), over);
  assert.equal(await budgets.getByRole('meter').count(), 3);
  assert.equal(
    await budgets.locator('.budgets-count').innerText(),
    'A budget counts what agentry’s own runs that finished this month (UTC) cost. Imported history is not counted. ' +
      'The forecast’s month so far, $347.45, includes $343.70 of imported history, which no budget counts.',
  );
  assert.ok((await region(page, 'Forecast').innerText()).includes('Month so far (UTC): $347.45.'));

  const outcomes = await region(page, 'Outcomes').locator('dl').innerText();
  assert.ok(outcomes.includes('Revision cost\n$12.35'), outcomes);
  assert.ok(outcomes.includes('Revisions per merged PR\n1.3'), outcomes);

  // Every money string on the page, the disclosure open, has at most two decimals.
  assert.doesNotMatch(await page.locator('body').innerText(), OVER_PRECISE);
  await screenshot(page, 'costs-outcomes-budgets');
  assert.deepEqual(await axeViolations(page), []);
  await page.close();
});

test('without imported history this month the Budgets region says only what a budget counts', { timeout: 60000 }, async () => {
  const page = await costsPageWith((r) => {
    r.budgets = [{ scope: 'instance', repoUrl: null, monthlyBudgetUsd: '300.0000', monthToDateUsd: '12.5000', forecastUsd: '40.0000', exhaustsOn: null }];
    r.forecast.monthCostSoFar = '12.5000';
    r.forecast.monthImportedCostSoFar = '0.0000';
  });
  const budgets = region(page, 'Budgets');
  assert.equal(
    await budgets.locator('.budgets-count').innerText(),
    'A budget counts what agentry’s own runs that finished this month (UTC) cost. Imported history is not counted.',
  );
  assert.equal(await budgets.locator('.budgets-imported').count(), 0);
  assert.doesNotMatch(await budgets.innerText(), /imported history, which/);
  assert.ok((await budgets.innerText()).includes('Month to date $12.50 of $300.00 (4.2%)'));
  assert.deepEqual(await axeViolations(page), []);
  await page.close();
});
