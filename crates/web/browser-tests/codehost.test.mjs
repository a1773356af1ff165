// /settings and /issues in Chromium against the real binary and the fake GitHub.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startService, startFakeGitHub, launch, signIn, screenshot, axeViolations, until } from './harness.mjs';

/** @type {import('./harness.mjs').Stack} */
let stack;
/** @type {{baseUrl: string, token: string, stop: () => void}} */
let fake;
/** @type {import('playwright-core').Browser} */
let browser;

before(async () => {
  fake = await startFakeGitHub();
  stack = await startService({ env: { AGENTRY_CODEHOST_API_URL: fake.baseUrl } });
  browser = await launch();
});

after(async () => {
  await browser?.close();
  await stack?.stop();
  fake?.stop();
});

/** @param {import('playwright-core').Page} page @param {string} name */
const region = (page, name) => page.getByRole('region', { name, exact: true });

test('settings: the code-host token, connecting, the agent settings and API tokens', { timeout: 90000 }, async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on('dialog', (d) => void d.accept());
  await signIn(page, `${stack.base}/settings`, stack.tokens.admin);
  await page.locator('main[data-ready="settings"]').waitFor();
  const secrets = region(page, 'Secrets');
  const repos = region(page, 'Repositories');
  // Connecting first says that the token is needed.
  assert.match(await repos.innerText(), /needs the code-host token first/);
  await repos.getByLabel('Repository URL').fill('https://github.com/acme/web');
  await repos.getByRole('button', { name: 'Connect' }).click();
  await repos.getByRole('alert').filter({ hasText: 'code-host token first' }).waitFor();

  // A refused token: the code host's answer is shown, nothing is stored.
  await secrets.getByLabel('Code-host token (CODEHOST_TOKEN)').fill('ghp_refusedbythecodehost');
  await secrets.getByRole('button', { name: 'Save token' }).click();
  const refused = await secrets.getByRole('alert').filter({ hasText: 'refused' }).innerText();
  assert.match(refused, /^The code host refused the token: /);
  assert.deepEqual((await stack.api('/api/secrets')).secrets, []);

  await secrets.getByLabel('Code-host token (CODEHOST_TOKEN)').fill(fake.token);
  await secrets.getByRole('button', { name: 'Save token' }).click();
  await secrets.getByText('The code host accepted the token').waitFor();
  await secrets.getByText('CODEHOST_TOKEN', { exact: true }).waitFor();
  assert.equal(await secrets.getByLabel('Code-host token (CODEHOST_TOKEN)').inputValue(), '');
  assert.ok(!(await page.content()).includes(fake.token), 'the token is never shown back');

  await repos.getByLabel('Repository URL').fill('https://github.com/acme/web');
  await repos.getByRole('button', { name: 'Connect' }).click();
  const web = repos.getByRole('article', { name: 'acme/web' });
  await web.waitFor();
  const [{ id: repoId }] = (await stack.api('/api/repos')).repos;

  // An invalid setting: the server's message next to its field, and nothing changes.
  const before = await stack.api(`/api/repos/${repoId}/settings`);
  await web.getByText('Agent settings').click();
  const form = web.getByRole('form', { name: 'Agent settings of acme/web' });
  const turns = form.getByLabel('Turn limit, coding');
  await until(async () => (await turns.inputValue()) === String(before.maxTurnsCoding), 'the settings');
  await form.getByLabel('Review model').fill('opus');
  await turns.fill('0');
  await form.getByRole('button', { name: 'Save settings' }).click();
  const expected = await fetch(`${stack.base}/api/repos/${repoId}/settings`, {
    method: 'PATCH',
    headers: { Authorization: `Bearer ${stack.tokens.admin}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ reviewModel: 'opus', maxTurnsCoding: 0 }),
  }).then((r) => r.json());
  const fieldError = form.locator('.field').filter({ has: page.locator('input[name="maxTurnsCoding"]') }).locator('.field-error');
  await until(async () => (await fieldError.innerText()) === expected.error.message, `the message "${expected.error.message}"`);
  assert.equal(await turns.getAttribute('aria-invalid'), 'true');
  assert.deepEqual(await stack.api(`/api/repos/${repoId}/settings`), before);

  // Provider-side tools are off by default; the checkbox says what it allows and why it is off.
  const providerTools = form.getByRole('checkbox', { name: /Provider-side tools/ });
  assert.equal(before.allowProviderTools, false);
  assert.equal(await providerTools.isChecked(), false);
  const providerHelp = await form.locator(`[id="${(await providerTools.getAttribute('aria-describedby'))?.split(' ')[0]}"]`).innerText();
  assert.match(providerHelp, /web fetch and search, MCP servers, code execution/);
  assert.match(providerHelp, /Off by default/);
  assert.match(providerHelp, /egress allow-list/);

  // A valid change is saved.
  await turns.fill('250');
  await form.getByLabel('Monthly budget (USD)').fill('100.50');
  await providerTools.check();
  await form.getByRole('button', { name: 'Save settings' }).click();
  await form.getByText('Saved.').waitFor();
  const after = await stack.api(`/api/repos/${repoId}/settings`);
  assert.equal(after.maxTurnsCoding, 250);
  assert.equal(after.monthlyBudgetUsd, '100.5');
  assert.equal(after.reviewModel, 'opus');
  assert.equal(after.allowProviderTools, true);
  assert.equal(await providerTools.isChecked(), true);

  // Unchecking it turns it off again, and only it changes.
  await providerTools.uncheck();
  await form.getByRole('button', { name: 'Save settings' }).click();
  await until(async () => (await stack.api(`/api/repos/${repoId}/settings`)).allowProviderTools === false, 'allowProviderTools off');
  assert.deepEqual(await stack.api(`/api/repos/${repoId}/settings`), { ...after, allowProviderTools: false });

  // API tokens: created (shown once), listed, revoked.
  const tokens = region(page, 'API tokens');
  await tokens.getByLabel('Name').fill('dashboard screen');
  await tokens.getByLabel('Role').selectOption('viewer');
  await tokens.getByRole('button', { name: 'Create token' }).click();
  const shown = await tokens.locator('.secret-once').innerText();
  assert.match(shown, /^agt_[A-Za-z0-9_-]{43}$/);
  await tokens.getByRole('button', { name: 'Revoke dashboard screen' }).waitFor();
  assert.equal((await fetch(`${stack.base}/api/repos`, { headers: { Authorization: `Bearer ${shown}` } })).status, 200);
  await screenshot(page, 'settings');
  assert.deepEqual(await axeViolations(page), []);
  await tokens.getByRole('button', { name: 'Revoke dashboard screen' }).click();
  await until(async () => (await tokens.getByRole('button', { name: 'Revoke dashboard screen' }).count()) === 0, 'the revocation');
  assert.equal((await fetch(`${stack.base}/api/repos`, { headers: { Authorization: `Bearer ${shown}` } })).status, 401);
  await page.close();
});

test('settings: a member sees the settings read-only and no admin actions', { timeout: 60000 }, async () => {
  const page = await browser.newPage();
  await signIn(page, `${stack.base}/settings`, stack.tokens.member);
  await page.locator('main[data-ready="settings"]').waitFor();
  assert.match(await region(page, 'Secrets').innerText(), /Only an admin/);
  assert.match(await region(page, 'API tokens').innerText(), /Only an admin/);
  assert.equal(await page.getByRole('button', { name: 'Connect' }).count(), 0);
  assert.equal(await page.getByRole('button', { name: 'Disconnect' }).count(), 0);
  assert.equal(await page.getByRole('button', { name: 'Save settings' }).count(), 0);
  await page.close();
});

test('issues: assigning creates one task and shows its state; a viewer cannot assign', { timeout: 90000 }, async () => {
  // Both repositories connected (acme/web by the test above; connecting again changes nothing).
  for (const repoUrl of ['https://github.com/acme/web', 'https://github.com/acme/api']) {
    await stack.api('/api/repos', { method: 'POST', body: { repoUrl } });
  }
  const viewer = await browser.newPage();
  await signIn(viewer, `${stack.base}/issues`, stack.tokens.viewer);
  await viewer.locator('main[data-ready="issues"]').waitFor();
  assert.equal(await viewer.getByRole('button', { name: 'Sync now' }).count(), 0);
  assert.equal(await viewer.getByRole('button', { name: 'Assign' }).count(), 0);
  await viewer.close();

  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await signIn(page, `${stack.base}/issues`, stack.tokens.member);
  await page.locator('main[data-ready="issues"]').waitFor();
  const issues = page.getByRole('list', { name: 'Open issues' }).getByRole('article');
  await until(async () => {
    if ((await issues.count()) === 3) return true;
    await page.getByRole('button', { name: 'Sync now' }).click();
    await page.locator('main[data-ready="issues"]').waitFor();
    return false;
  }, 'the three open issues');
  const card = page.getByRole('article', { name: /Login page crashes on empty password/ });
  assert.match(await card.innerText(), /#2/);
  assert.match(await card.innerText(), /acme\/web/);
  const bug = card.getByRole('listitem').filter({ hasText: 'bug' });
  assert.equal(await bug.evaluate((el) => getComputedStyle(el).backgroundColor), 'rgb(215, 58, 74)');

  await card.getByLabel('Agent').selectOption('codex');
  await card.getByRole('button', { name: 'Assign' }).click();
  const link = card.getByRole('link', { name: 'Task queued' });
  await link.waitFor();
  // No reload: the other cards are the same elements, and the card kept its place.
  assert.equal(await page.getByRole('status').filter({ hasText: 'assigned' }).count(), 1);
  const { tasks } = await stack.api('/api/tasks');
  const created = tasks.filter((/** @type {any} */ t) => t.issueNumber === 2);
  assert.equal(created.length, 1);
  assert.equal(created[0].state, 'queued');
  assert.equal(created[0].agentType, 'codex');
  assert.equal(await link.getAttribute('href'), `/tasks/${created[0].id}`);

  // The repository filter lives in the URL.
  const repos = (await stack.api('/api/repos')).repos;
  const api = repos.find((/** @type {any} */ r) => r.repoUrl.endsWith('/api'));
  await page.getByLabel('Repository', { exact: true }).selectOption(api.id);
  await page.locator('main[data-ready="issues"]').waitFor();
  assert.equal(new URL(page.url()).searchParams.get('repoId'), api.id);
  assert.equal(await issues.count(), 1);
  await page.getByLabel('Repository', { exact: true }).selectOption('');
  await page.locator('main[data-ready="issues"]').waitFor();
  await until(async () => (await issues.count()) === 3, 'all issues again');
  // Linked issues come after the unassigned ones, showing their task's state.
  assert.match(await issues.last().innerText(), /Login page crashes/);
  await screenshot(page, 'issues');
  assert.deepEqual(await axeViolations(page), []);
  await link.click();
  await page.waitForURL(`${stack.base}/tasks/${created[0].id}`);
  await page.locator('main[data-ready="task:queued"]').waitFor();
  // A member cancels the task, then runs it again.
  await page.getByRole('button', { name: 'Cancel' }).click();
  await page.locator('main[data-ready="task:cancelled"]').waitFor();
  await page.getByRole('button', { name: 'Retry' }).click();
  await page.locator('main[data-ready="task:queued"]').waitFor();
  const again = await stack.api(`/api/tasks/${created[0].id}`);
  assert.equal(again.state, 'queued');
  assert.equal(again.attempt, 2);
  assert.equal(again.imported, false);
  assert.ok((await page.getByRole('region', { name: 'State history' }).innerText()).includes('Cancelled'));
  await page.close();
});
