// @ts-check
/**
 * /settings: the instance's monthly budget and this month's budget alerts, the code-host
 * token (a secret, never shown back), the repositories with their agent settings, and the
 * API tokens. What a token's role may not do is not offered.
 */
import { api, ApiError, can } from './api.js';
import { fill, h, region, uid } from './dom.js';
import { moneyEl, repoName, time, utcDay } from './format.js';

/** @typedef {import('../types/api').RepoDto} RepoDto */
/** @typedef {import('../types/api').RepoListDto} RepoListDto */
/** @typedef {import('../types/api').SecretListDto} SecretListDto */
/** @typedef {import('../types/api').SecretDto} SecretDto */
/** @typedef {import('../types/api').TokenListDto} TokenListDto */
/** @typedef {import('../types/api').CreatedTokenDto} CreatedTokenDto */
/** @typedef {import('../types/api').BudgetDto} BudgetDto */
/** @typedef {import('../types/api').BudgetAlertDto} BudgetAlertDto */
/** @typedef {import('../types/api').BudgetAlertListDto} BudgetAlertListDto */

/**
 * The agent settings of docs/contract.md#35-repository-settings.
 * @typedef {import('../types/api').RepoSettingsDto} RepoSettings
 */

/**
 * @typedef {object} Field
 * @property {keyof RepoSettings} name
 * @property {string} label
 * @property {'text' | 'integer' | 'agent' | 'boolean'} kind
 * @property {string} help
 * @property {boolean} [nullable] blank means null
 */

/** @type {Field[]} */
const FIELDS = [
  { name: 'codingModel', label: 'Coding model', kind: 'text', help: 'Model of coding tasks.' },
  { name: 'reviewModel', label: 'Review model', kind: 'text', help: 'Model of review tasks.' },
  { name: 'maxTurnsCoding', label: 'Turn limit, coding', kind: 'integer', nullable: true, help: '1 to 1000; blank for the agent’s own limit.' },
  { name: 'maxTurnsReview', label: 'Turn limit, review', kind: 'integer', help: '1 to 1000.' },
  { name: 'agentType', label: 'Default agent', kind: 'agent', help: 'The agent of assigned issues.' },
  { name: 'autoReview', label: 'Review each pull request', kind: 'boolean', help: 'Queue a review task when a pull request opens.' },
  { name: 'maxCostPerTaskUsd', label: 'Cost limit per task (USD)', kind: 'text', nullable: true, help: 'A decimal such as 5.00; blank for none.' },
  { name: 'monthlyBudgetUsd', label: 'Monthly budget (USD)', kind: 'text', nullable: true, help: 'What this repository’s runs may spend per UTC month; blank for none.' },
  {
    name: 'allowProviderTools',
    label: 'Provider-side tools',
    kind: 'boolean',
    help: 'Let model calls ask the provider to reach out for the agent: web fetch and search, MCP servers, code execution. Off by default: the provider’s servers would reach any host for the agent, past this repository’s egress allow-list.',
  },
];

/**
 * An error message next to a form: `role=alert` so it is announced.
 * @returns {HTMLParagraphElement}
 */
function problemLine() {
  return h('p', { class: 'field-error', role: 'alert' });
}

/** @param {unknown} err */
function messageOf(err) {
  return err instanceof ApiError ? err.message : 'The API could not be reached.';
}

/**
 * A form of one labelled input: its help text (the input's description), its buttons, and
 * the lines that announce a problem (an alert) and a success (a status).
 * @param {HTMLInputElement} input given an id and its description here
 * @param {string} label
 * @param {string} help
 * @param {...HTMLElement} buttons
 */
function oneFieldForm(input, label, help, ...buttons) {
  input.id = uid('field');
  const helpId = uid('help');
  input.setAttribute('aria-describedby', helpId);
  const problem = problemLine();
  const done = h('p', { class: 'ok', role: 'status' });
  const form = h(
    'form',
    { class: 'stack' },
    h('label', { for: input.id }, label),
    input,
    h('p', { id: helpId, class: 'note' }, help),
    h('div', { class: 'actions' }, ...buttons),
    problem,
    done,
  );
  return { form, problem, done };
}

/**
 * The instance's monthly budget (`GET /api/budget`): shown to every role, set or removed by
 * an admin (`PUT /api/budget`).
 */
function budgetRegion() {
  const section = region('Monthly budget', { class: 'panel' });
  const figures = h('dl', { class: 'fields' });
  section.append(
    h('p', { class: 'note' }, 'What all repositories together may spend per UTC calendar month. Queued tasks wait while the month has nothing left.'),
    figures,
  );
  const admin = can('admin');
  const input = h('input', { type: 'text', inputmode: 'decimal', autocomplete: 'off', spellcheck: 'false' });
  if (admin) {
    const remove = h('button', { type: 'button', class: 'danger' }, 'Remove budget');
    const { form, problem, done } = oneFieldForm(
      input,
      'Monthly budget (USD)',
      'A decimal such as 500.00 (at most 9 decimals).',
      h('button', { type: 'submit' }, 'Save budget'),
      remove,
    );
    /** @param {string | null} value */
    const save = async (value) => {
      problem.textContent = '';
      done.textContent = '';
      input.removeAttribute('aria-invalid');
      try {
        /** @type {BudgetDto} */
        const b = await api('/api/budget', { method: 'PUT', body: { monthlyBudgetUsd: value } });
        show(b);
        done.textContent = value === null ? 'The budget is removed.' : 'Saved.';
      } catch (err) {
        problem.textContent = messageOf(err);
        input.setAttribute('aria-invalid', 'true');
        input.focus();
      }
    };
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      const text = input.value.trim();
      void save(text === '' ? null : text);
    });
    remove.addEventListener('click', () => void save(null));
    section.append(form);
  } else {
    section.append(h('p', { class: 'note' }, 'Only an admin token changes the budget.'));
  }
  /** @param {BudgetDto} b */
  const show = (b) => {
    /** @type {[string, Node | string][]} */
    const rows = [
      ['Budget', b.monthlyBudgetUsd === null || b.monthlyBudgetUsd === undefined ? 'none' : moneyEl(b.monthlyBudgetUsd)],
      ['Month (UTC)', b.month],
      ['Month to date', moneyEl(b.monthToDateUsd)],
      ['Reserved by runs in progress', moneyEl(b.reservedUsd)],
    ];
    if (b.monthlyBudgetUsd !== null && b.monthlyBudgetUsd !== undefined) {
      rows.push(['Remaining', moneyEl(b.remainingUsd)]);
      rows.push(['Forecast for the month', moneyEl(b.forecastUsd)]);
      rows.push(['Runs out', b.exhaustsOn ? `${utcDay(b.exhaustsOn)} (UTC)` : 'lasts the month at this rate']);
    }
    fill(figures, ...rows.flatMap(([term, value]) => [h('dt', {}, term), h('dd', {}, value)]));
    if (admin && document.activeElement !== input) input.value = b.monthlyBudgetUsd ?? '';
  };
  const load = async () => {
    /** @type {BudgetDto} */
    const b = await api('/api/budget');
    show(b);
    return b.month;
  };
  return { section, load };
}

/**
 * The budget alerts sent this month (`GET /api/budget/alerts`, newest first).
 */
function alertsRegion() {
  const section = region('Budget alerts', { class: 'panel' });
  const list = h('ul', { class: 'plain alerts' });
  section.append(h('p', { class: 'note' }, 'Each budget alerts once a month at 50 %, 80 % and 100 %.'), list);
  const delivery = { pending: 'being delivered', delivered: 'delivered', unsent: 'recorded (no alert webhook is set)' };
  /** @param {string} month `YYYY-MM` */
  const load = async (month) => {
    /** @type {BudgetAlertDto[]} */
    const alerts = [];
    /** @type {string | null | undefined} */
    let cursor = null;
    // Newest first: this month's alerts come first; stop at the first older one.
    for (let page = 0; page < 10; page += 1) {
      /** @type {BudgetAlertListDto} */
      const r = await api(`/api/budget/alerts?limit=200${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
      const mine = r.alerts.filter((a) => a.month === month);
      alerts.push(...mine);
      cursor = r.nextCursor;
      if (!cursor || mine.length < r.alerts.length) break;
    }
    fill(
      list,
      ...(alerts.length === 0
        ? [h('li', { class: 'state' }, `No budget alert in ${month}.`)]
        : alerts.map((a) =>
            h(
              'li',
              { class: `alert-${a.threshold >= 100 ? 'over' : a.threshold >= 80 ? 'warn' : 'ok'}` },
              h('strong', {}, `${a.threshold} % reached`),
              ` · ${a.scope === 'instance' ? 'the instance' : repoName(a.repoUrl ?? '')}: `,
              moneyEl(a.spentUsd),
              ' of ',
              moneyEl(a.monthlyBudgetUsd),
              ' · ',
              time(a.createdAt),
              ` · ${delivery[/** @type {keyof typeof delivery} */ (a.delivery)] ?? a.delivery}`,
            ),
          )),
    );
  };
  return { section, load };
}

/**
 * The code-host token.
 * @param {() => void} changed called after the token was stored
 */
function secretsRegion(changed) {
  const list = h('ul', { class: 'plain' });
  const section = region('Secrets', { class: 'panel' });
  if (!can('admin')) {
    section.append(h('p', {}, 'Only an admin token manages secrets.'));
    return { section, load: async () => false };
  }
  const input = h('input', { type: 'password', autocomplete: 'off', spellcheck: 'false', required: true });
  const { form, problem, done } = oneFieldForm(
    input,
    'Code-host token (CODEHOST_TOKEN)',
    'A GitHub token with Issues, Pull requests and Contents read/write and Metadata read. It is checked with the code host, stored encrypted and never shown again.',
    h('button', { type: 'submit' }, 'Save token'),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    problem.textContent = '';
    done.textContent = '';
    try {
      await api('/api/secrets/CODEHOST_TOKEN', { method: 'PUT', body: { value: input.value } });
      input.value = '';
      done.textContent = 'The code host accepted the token; it is stored.';
      await load();
      changed();
    } catch (err) {
      problem.textContent =
        err instanceof ApiError && err.code === 'codehost_rejected'
          ? `The code host refused the token: ${err.message}`
          : messageOf(err);
    }
  });
  section.append(form, h('h3', {}, 'Stored secrets'), list);
  /** @returns {Promise<boolean>} whether CODEHOST_TOKEN is stored */
  const load = async () => {
    /** @type {SecretListDto} */
    const r = await api('/api/secrets');
    fill(
      list,
      ...(r.secrets.length === 0
        ? [h('li', {}, 'None yet.')]
        : r.secrets.map((/** @type {SecretDto} */ s) => h('li', {}, h('code', {}, s.name), ' · set ', time(s.updatedAt)))),
    );
    return r.secrets.some((s) => s.name === 'CODEHOST_TOKEN');
  };
  return { section, load };
}

/**
 * The settings form of one repository.
 * @param {RepoDto} repo
 */
function settingsForm(repo) {
  const admin = can('admin');
  const form = h('form', { class: 'settings-form', 'aria-label': `Agent settings of ${repoName(repo.repoUrl)}` });
  const formProblem = problemLine();
  const done = h('p', { class: 'ok', role: 'status' });
  /** @type {Map<string, {input: HTMLInputElement | HTMLSelectElement, error: HTMLElement, field: Field}>} */
  const controls = new Map();
  /** @type {RepoSettings | null} */
  let current = null;

  for (const field of FIELDS) {
    const id = uid(field.name);
    const errorId = uid('err');
    const helpId = uid('help');
    /** @type {HTMLInputElement | HTMLSelectElement} */
    let input;
    if (field.kind === 'agent') {
      input = h('select', { id, name: field.name }, h('option', { value: 'claude-code' }, 'claude-code'), h('option', { value: 'codex' }, 'codex'));
    } else if (field.kind === 'boolean') {
      input = h('input', { id, name: field.name, type: 'checkbox' });
    } else {
      input = h('input', { id, name: field.name, type: 'text', inputmode: field.kind === 'integer' ? 'numeric' : null, autocomplete: 'off', spellcheck: 'false' });
    }
    input.disabled = !admin;
    input.setAttribute('aria-describedby', `${helpId} ${errorId}`);
    const error = h('p', { id: errorId, class: 'field-error' });
    controls.set(field.name, { input, error, field });
    form.append(
      h(
        'div',
        { class: `field field-${field.kind}` },
        h('label', { for: id }, field.label, ' ', h('code', {}, field.name)),
        input,
        h('p', { id: helpId, class: 'note' }, field.help),
        error,
      ),
    );
  }
  if (admin) form.append(h('div', { class: 'actions' }, h('button', { type: 'submit' }, 'Save settings')));
  form.append(formProblem, done);

  /** @param {RepoSettings} s */
  const show = (s) => {
    current = s;
    for (const { input, field } of controls.values()) {
      const value = s[field.name];
      if (input instanceof HTMLInputElement && field.kind === 'boolean') input.checked = value === true;
      else input.value = value === null || value === undefined ? '' : String(value);
    }
  };

  const clearErrors = () => {
    formProblem.textContent = '';
    done.textContent = '';
    for (const { input, error } of controls.values()) {
      error.textContent = '';
      input.removeAttribute('aria-invalid');
    }
  };

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    clearErrors();
    if (!current) return;
    /** @type {Record<string, unknown>} */
    const patch = {};
    for (const { input, field } of controls.values()) {
      /** @type {unknown} */
      let value;
      if (input instanceof HTMLInputElement && field.kind === 'boolean') value = input.checked;
      else {
        const text = input.value.trim();
        if (text === '' && field.nullable) value = null;
        else if (field.kind === 'integer' && /^-?\d+$/.test(text)) value = Number(text);
        else value = text;
      }
      if (value !== current[field.name]) patch[field.name] = value;
    }
    if (Object.keys(patch).length === 0) {
      done.textContent = 'Nothing changed.';
      return;
    }
    try {
      /** @type {RepoSettings} */
      const saved = await api(`/api/repos/${repo.id}/settings`, { method: 'PATCH', body: patch });
      show(saved);
      done.textContent = 'Saved.';
    } catch (err) {
      const message = messageOf(err);
      // Validation messages start with the member's name: show it next to that field.
      const named = /^([A-Za-z]+)/.exec(message)?.[1];
      const target = named ? controls.get(named) : undefined;
      if (target) {
        target.error.textContent = message;
        target.input.setAttribute('aria-invalid', 'true');
        target.input.focus();
      } else {
        formProblem.textContent = message;
      }
    }
  });

  const load = async () => {
    try {
      show(await api(`/api/repos/${repo.id}/settings`));
    } catch (err) {
      formProblem.textContent = `The settings could not be loaded: ${messageOf(err)}`;
    }
  };
  return { form, load };
}

/**
 * The repositories: connect, list, disconnect, settings.
 */
function reposRegion() {
  const admin = can('admin');
  const section = region('Repositories', { class: 'panel wide' });
  const tokenNote = h('p', { class: 'note' }, 'Connecting a repository needs the code-host token (Secrets) first: the repository is looked up on the code host.');
  const list = h('ul', { class: 'repos' });
  const problem = problemLine();
  if (admin) {
    const id = uid('repo-url');
    const input = h('input', { id, type: 'text', required: true, placeholder: 'https://github.com/org/repo', autocomplete: 'off', spellcheck: 'false' });
    const form = h('form', { class: 'inline' }, h('label', { for: id }, 'Repository URL'), input, h('button', { type: 'submit' }, 'Connect'));
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      problem.textContent = '';
      try {
        await api('/api/repos', { method: 'POST', body: { repoUrl: input.value.trim() } });
        input.value = '';
        await load();
      } catch (err) {
        problem.textContent =
          err instanceof ApiError && err.code === 'codehost_token_missing'
            ? 'Set the code-host token first (Secrets).'
            : messageOf(err);
      }
    });
    section.append(tokenNote, form, problem);
  }
  section.append(list);

  const load = async () => {
    /** @type {RepoListDto} */
    const r = await api('/api/repos');
    if (r.repos.length === 0) {
      fill(list, h('li', { class: 'state' }, 'No repository is connected.'));
      return;
    }
    fill(
      list,
      ...r.repos.map((repo) => {
        const { form, load: loadSettings } = settingsForm(repo);
        const details = h('details', {}, h('summary', {}, 'Agent settings'), form);
        details.addEventListener('toggle', () => {
          if (details.open) void loadSettings();
        });
        const disconnect = admin ? h('button', { type: 'button', class: 'danger' }, 'Disconnect') : null;
        const rowProblem = problemLine();
        disconnect?.addEventListener('click', async () => {
          if (!window.confirm(`Disconnect ${repoName(repo.repoUrl)}? Its tasks, costs and settings stay.`)) return;
          try {
            await api(`/api/repos/${repo.id}`, { method: 'DELETE' });
            await load();
          } catch (err) {
            rowProblem.textContent = messageOf(err);
          }
        });
        const titleId = uid('repo');
        return h(
          'li',
          {},
          h(
            'article',
            { class: 'repo', 'aria-labelledby': titleId },
            h('h3', { id: titleId }, repoName(repo.repoUrl)),
            h('p', { class: 'meta' }, `default branch ${repo.defaultBranch} · connected `, time(repo.connectedAt), ' ', disconnect),
            rowProblem,
            details,
          ),
        );
      }),
    );
  };
  return {
    section,
    load,
    /** @param {boolean} hasToken */
    tokenKnown: (hasToken) => {
      tokenNote.textContent = hasToken
        ? 'The code-host token is set: repositories it can see may be connected.'
        : 'Connecting a repository needs the code-host token first: set CODEHOST_TOKEN under Secrets.';
    },
  };
}

/** API tokens (admin). */
function tokensRegion() {
  const section = region('API tokens', { class: 'panel wide' });
  if (!can('admin')) {
    section.append(h('p', {}, 'Only an admin token manages API tokens.'));
    return { section, load: async () => {} };
  }
  const nameId = uid('token-name');
  const roleId = uid('token-role');
  const name = h('input', { id: nameId, type: 'text', required: true, maxlength: 100, autocomplete: 'off' });
  const role = h('select', { id: roleId }, h('option', { value: 'viewer' }, 'viewer'), h('option', { value: 'member' }, 'member'), h('option', { value: 'admin' }, 'admin'));
  const created = h('div', { role: 'status' });
  const problem = problemLine();
  const form = h(
    'form',
    { class: 'inline' },
    h('label', { for: nameId }, 'Name'),
    name,
    h('label', { for: roleId }, 'Role'),
    role,
    h('button', { type: 'submit' }, 'Create token'),
  );
  const list = h('ul', { class: 'plain' });
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    problem.textContent = '';
    fill(created);
    try {
      /** @type {CreatedTokenDto} */
      const t = await api('/api/tokens', { method: 'POST', body: { name: name.value, role: role.value } });
      name.value = '';
      fill(
        created,
        h('p', { class: 'ok' }, `Token “${t.name}” (${t.role}) created. Copy it now: it is not shown again.`),
        h('p', {}, h('code', { class: 'secret-once' }, t.token)),
      );
      await load();
    } catch (err) {
      problem.textContent = messageOf(err);
    }
  });
  section.append(form, problem, created, list);
  const load = async () => {
    /** @type {TokenListDto} */
    const r = await api('/api/tokens');
    fill(
      list,
      ...r.tokens.map((t) => {
        const revoke = h('button', { type: 'button', class: 'danger', 'aria-label': `Revoke ${t.name}` }, 'Revoke');
        revoke.addEventListener('click', async () => {
          if (!window.confirm(`Revoke the token “${t.name}”? Requests with it are refused from now on.`)) return;
          try {
            await api(`/api/tokens/${t.id}`, { method: 'DELETE' });
            await load();
          } catch (err) {
            problem.textContent = messageOf(err);
          }
        });
        return h('li', {}, h('strong', {}, t.name), ` · ${t.role} · created `, time(t.createdAt), ' ', revoke);
      }),
    );
  };
  return { section, load };
}

/**
 * Builds /settings into `main`.
 * @param {HTMLElement} main
 */
export function settingsPage(main) {
  document.title = 'Settings · agentry';
  const status = h('p', { class: 'state', role: 'status' }, 'Loading…');
  const repos = reposRegion();
  const secrets = secretsRegion(() => repos.tokenKnown(true));
  const tokens = tokensRegion();
  const alerts = alertsRegion();
  const budget = budgetRegion();
  fill(
    main,
    h('h1', {}, 'Settings'),
    status,
    h('div', { class: 'settings' }, h('div', { class: 'columns' }, budget.section, alerts.section), secrets.section, repos.section, tokens.section),
  );
  Promise.all([
    budget.load().then((month) => alerts.load(month)),
    secrets.load().then((has) => can('admin') && repos.tokenKnown(has)),
    repos.load(),
    tokens.load(),
  ])
    .then(() => {
      status.textContent = '';
      main.dataset.ready = 'settings';
    })
    .catch((err) => {
      status.className = 'state error';
      status.textContent = `The settings could not be loaded: ${messageOf(err)}`;
      main.dataset.ready = 'error';
    });
}
