// Measures /costs in headless Chromium against a running service (scripts/bench-browser.sh
// starts it on 1,000,000 imported tasks):
//
//   node bench/costs-bench.mjs BASE VIEWER_TOKEN [RUNS] [--screenshot FILE]
//
// Each run opens /costs in a fresh browser context (a cold load: empty cache), and records
// * load: from the start of navigation to the frame after every card, chart, notice and the
//   table are drawn (the page's `agentry:costs-rendered` performance mark);
// * bytes: the bodies of every response the page downloaded, uncompressed (HTML, CSS,
//   JavaScript, icon and the API's JSON);
// * period and repository: from a filter's change event to the frame after the new report is
//   drawn (30 → 90 days, then one repository).
// It prints every run and the medians.
import { chromium } from 'playwright-core';

const [base, token, runsArg] = process.argv.slice(2).filter((a, i, all) => !a.startsWith('--') && all[i - 1] !== '--screenshot');
const shotAt = process.argv.indexOf('--screenshot');
const shot = shotAt > 0 ? process.argv[shotAt + 1] : null;
const runs = Number(runsArg ?? 7);
if (!base || !token) {
  console.error('usage: costs-bench.mjs BASE VIEWER_TOKEN [RUNS] [--screenshot FILE]');
  process.exit(2);
}

/** @param {number[]} xs */
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/**
 * Changes a filter in the page and resolves to the milliseconds until the next report is
 * drawn (measured in the page, so the test driver's latency is not counted).
 * @param {import('playwright-core').Page} page
 * @param {string} id the select's id
 * @param {string} value
 */
async function change(page, id, value) {
  return page.evaluate(
    ([id, value]) =>
      new Promise((resolve) => {
        const select = /** @type {HTMLSelectElement} */ (document.getElementById(id));
        const t0 = performance.now();
        const observer = new PerformanceObserver((list) => {
          for (const e of list.getEntries()) {
            if (e.name === 'agentry:costs-rendered' && e.startTime > t0) {
              observer.disconnect();
              resolve(e.startTime - t0);
            }
          }
        });
        observer.observe({ type: 'mark' });
        select.value = value;
        select.dispatchEvent(new Event('change'));
      }),
    [id, value],
  );
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox'],
});
const loads = [];
const bytes = [];
const periods = [];
const repos = [];
const apiBytes = [];
for (let i = 1; i <= runs; i += 1) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  await context.addInitScript(
    ([t]) => {
      localStorage.setItem('agentry.token', t);
      localStorage.setItem('agentry.role', 'viewer');
    },
    [token],
  );
  const page = await context.newPage();
  /** @type {Promise<[string, number]>[]} */
  const bodies = [];
  page.on('response', (r) => bodies.push(r.body().then((b) => [r.url(), b.length], () => [r.url(), 0])));
  await page.goto(`${base}/costs`);
  await page.waitForFunction(() => performance.getEntriesByName('agentry:costs-rendered').length > 0, null, { timeout: 30000 });
  const load = await page.evaluate(() => performance.getEntriesByName('agentry:costs-rendered')[0].startTime);
  const sizes = await Promise.all(bodies);
  const total = sizes.reduce((a, [, n]) => a + n, 0);
  const api = sizes.filter(([u]) => u.includes('/api/')).reduce((a, [, n]) => a + n, 0);
  const period = await change(page, 'f-period', '90');
  const repoUrl = await page.evaluate(() => {
    const options = /** @type {HTMLSelectElement} */ (document.getElementById('f-repo')).options;
    return options.length > 1 ? options[1].value : '';
  });
  const repo = await change(page, 'f-repo', repoUrl);
  loads.push(load);
  bytes.push(total);
  apiBytes.push(api);
  periods.push(period);
  repos.push(repo);
  console.log(
    `run ${i}: load ${load.toFixed(0)} ms, ${sizes.length} responses, ${(total / 1024).toFixed(1)} KiB ` +
      `(API ${(api / 1024).toFixed(1)} KiB); period 30→90 days ${period.toFixed(0)} ms; repository ${repo.toFixed(0)} ms`,
  );
  if (shot && i === runs) {
    await change(page, 'f-repo', '');
    await change(page, 'f-period', '30');
    await page.mouse.move(0, 0);
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`screenshot: ${shot}`);
  }
  await context.close();
}
await browser.close();
console.log(
  `median of ${runs}: load ${median(loads).toFixed(0)} ms, downloaded ${(median(bytes) / 1024).toFixed(1)} KiB ` +
    `(API ${(median(apiBytes) / 1024).toFixed(1)} KiB), period change ${median(periods).toFixed(0)} ms, ` +
    `repository change ${median(repos).toFixed(0)} ms`,
);
