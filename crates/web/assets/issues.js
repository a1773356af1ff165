// @ts-check
/**
 * /issues: the open issues of every connected repository (unassigned first, the API's
 * order), a repository filter in the URL, "Sync now", and Assign on each unassigned issue.
 */
import { api, ApiError, can } from './api.js';
import { fill, h, uid } from './dom.js';
import { repoName, stateBadge, time } from './format.js';

/** @typedef {import('../types/api').IssueDto} IssueDto */
/** @typedef {import('../types/api').IssueListDto} IssueListDto */
/** @typedef {import('../types/api').RepoDto} RepoDto */
/** @typedef {import('../types/api').RepoListDto} RepoListDto */
/** @typedef {import('../types/api').AssignedDto} AssignedDto */
/** @typedef {import('../types/api').AssignIssue} AssignIssue */
/** @typedef {import('../types/api').LinkedTaskDto} LinkedTaskDto */

const AGENTS = ['claude-code', 'codex'];

/**
 * Black or white text, whichever reads better on the label colour `hex` (six hex digits).
 * @param {string} hex
 */
export function textOn(hex) {
  if (!/^[0-9a-fA-F]{6}$/.test(hex)) return '#000000';
  /** @param {number} c */
  const lin = (c) => {
    const v = c / 255;
    return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
  };
  const [r, g, b] = [0, 2, 4].map((i) => lin(parseInt(hex.slice(i, i + 2), 16)));
  const l = 0.2126 * r + 0.7152 * g + 0.0722 * b;
  return (l + 0.05) / 0.05 > 1.05 / (l + 0.05) ? '#000000' : '#ffffff';
}

/**
 * A label in its own colour.
 * @param {{name: string, color: string}} label
 */
function labelChip(label) {
  const chip = h('li', { class: 'label' }, label.name);
  if (/^[0-9a-fA-F]{6}$/.test(label.color)) {
    chip.style.backgroundColor = `#${label.color}`;
    chip.style.color = textOn(label.color);
  }
  return chip;
}

/**
 * The linked task: its state, as a link to it, and its pull request.
 * @param {LinkedTaskDto} task
 */
function linkedTask(task) {
  return h(
    'p',
    { class: 'linked' },
    'Task: ',
    h('a', { href: `/tasks/${task.id}`, 'aria-label': `Task ${task.state.replace('_', ' ')}` }, stateBadge(task.state)),
    task.prUrl ? h('span', {}, ' · ', h('a', { href: task.prUrl, rel: 'noopener noreferrer' }, 'pull request')) : null,
  );
}

/**
 * @param {IssueDto} issue
 * @param {Map<string, RepoDto>} repos
 * @param {HTMLElement} status
 */
function issueCard(issue, repos, status) {
  const titleId = uid('issue');
  const action = h('div', { class: 'issue-action' });
  if (issue.task) {
    fill(action, linkedTask(issue.task));
  } else if (can('member')) {
    const agentId = uid('agent');
    const settings = /** @type {Record<string, unknown>} */ (repos.get(issue.repoId)?.settings ?? {});
    const preferred = typeof settings.agentType === 'string' ? settings.agentType : 'claude-code';
    const agent = h('select', { id: agentId }, ...AGENTS.map((a) => h('option', { value: a, selected: a === preferred }, a)));
    const button = h('button', { type: 'submit' }, 'Assign');
    const problem = h('p', { class: 'field-error', role: 'alert' });
    const form = h('form', { class: 'assign' }, h('label', { for: agentId }, 'Agent'), agent, button, problem);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      button.disabled = true;
      problem.textContent = '';
      /** @type {AssignIssue} */
      const body = {
        issueNumber: issue.number,
        repoId: issue.repoId,
        title: issue.title,
        body: issue.body,
        agentType: /** @type {AssignIssue['agentType']} */ (agent.value),
      };
      try {
        /** @type {AssignedDto} */
        const answer = await api('/api/issues/assign', { method: 'POST', body });
        issue.task = { id: answer.task.id, state: answer.task.state, prUrl: answer.task.prUrl ?? null };
        fill(action, linkedTask(issue.task));
        status.textContent = `Issue #${issue.number} assigned: task ${answer.task.state}.`;
      } catch (err) {
        problem.textContent = err instanceof ApiError ? err.message : 'The assignment failed.';
        button.disabled = false;
      }
    });
    fill(action, form);
  } else {
    fill(action, h('p', { class: 'linked' }, 'Not assigned'));
  }
  return h(
    'li',
    {},
    h(
      'article',
      { class: 'issue', 'aria-labelledby': titleId },
      h(
        'h2',
        { id: titleId },
        h('a', { href: issue.htmlUrl, rel: 'noopener noreferrer' }, issue.title),
        ' ',
        h('span', { class: 'number' }, `#${issue.number}`),
      ),
      h('p', { class: 'meta' }, repoName(issue.repoUrl), ' · opened by ', issue.author, ' · updated ', time(issue.updatedAt)),
      issue.labels.length ? h('ul', { class: 'labels', 'aria-label': 'Labels' }, ...issue.labels.map(labelChip)) : null,
      action,
    ),
  );
}

/**
 * Builds /issues into `main`.
 * @param {HTMLElement} main
 */
export function issuesPage(main) {
  document.title = 'Issues · agentry';
  const url = new URL(location.href);
  const repoId = url.searchParams.get('repoId') ?? '';
  const repoSelect = h('select', { id: 'f-repo', name: 'repoId' }, h('option', { value: '' }, 'All repositories'));
  const sync = can('member') ? h('button', { type: 'button' }, 'Sync now') : null;
  const status = h('p', { class: 'state', role: 'status' }, 'Loading…');
  const problems = h('div', { class: 'problems' });
  const list = h('ul', { class: 'issues', 'aria-label': 'Open issues' });
  const more = h('button', { type: 'button', hidden: true }, 'Load more');
  const filters = h('form', { class: 'filters', 'aria-label': 'Filters' }, h('label', { for: 'f-repo' }, 'Repository'), repoSelect, sync);
  filters.addEventListener('submit', (e) => e.preventDefault());
  fill(main, h('div', { class: 'page-head' }, h('h1', {}, 'Issues'), filters), status, problems, list, more);

  /** @type {Map<string, RepoDto>} */
  const repos = new Map();
  /** @type {string | null} */
  let cursor = null;
  let shown = 0;

  /** @param {IssueListDto} page @param {boolean} replace */
  const draw = (page, replace) => {
    if (replace) {
      fill(list);
      shown = 0;
    }
    list.append(...page.issues.map((i) => issueCard(i, repos, status)));
    shown += page.issues.length;
    cursor = page.nextCursor ?? null;
    more.hidden = cursor === null;
    fill(
      problems,
      ...page.errors.map((e) =>
        h('p', { class: 'notice warn', role: 'alert' }, `The last sync of ${repoName(repos.get(e.repoId)?.repoUrl ?? e.repoId)} failed: ${e.message}`),
      ),
    );
    status.className = 'state';
    if (repos.size === 0) {
      status.textContent = 'No repository is connected yet. Connect one in Settings.';
    } else {
      status.textContent = shown === 0 ? 'No open issues.' : `${shown} open ${shown === 1 ? 'issue' : 'issues'}${cursor ? ' shown' : ''}.`;
    }
    main.dataset.ready = 'issues';
  };

  /** @param {unknown} err */
  const failed = (err) => {
    status.className = 'state error';
    status.textContent = `The issues could not be loaded: ${err instanceof ApiError ? err.message : 'the API could not be reached.'}`;
    main.dataset.ready = 'error';
  };

  const query = () => {
    const q = new URLSearchParams();
    if (repoSelect.value) q.set('repoId', repoSelect.value);
    return q;
  };

  const load = async () => {
    status.textContent = 'Loading…';
    delete main.dataset.ready;
    try {
      /** @type {IssueListDto} */
      const page = await api(`/api/issues?${query()}`);
      draw(page, true);
    } catch (err) {
      failed(err);
    }
  };

  more.addEventListener('click', async () => {
    if (!cursor) return;
    const q = query();
    q.set('cursor', cursor);
    try {
      draw(await api(`/api/issues?${q}`), false);
    } catch (err) {
      failed(err);
    }
  });

  sync?.addEventListener('click', async () => {
    sync.disabled = true;
    status.textContent = 'Syncing…';
    try {
      draw(await api(`/api/issues/sync?${query()}`, { method: 'POST' }), true);
    } catch (err) {
      failed(err);
    } finally {
      sync.disabled = false;
    }
  });

  repoSelect.addEventListener('change', () => {
    const q = query();
    history.pushState(null, '', q.toString() ? `/issues?${q}` : '/issues');
    void load();
  });
  window.onpopstate = () => {
    repoSelect.value = new URL(location.href).searchParams.get('repoId') ?? '';
    void load();
  };

  api('/api/repos')
    .then((/** @type {RepoListDto} */ r) => {
      for (const repo of r.repos) {
        repos.set(repo.id, repo);
        repoSelect.append(h('option', { value: repo.id }, repoName(repo.repoUrl)));
      }
      repoSelect.value = repos.has(repoId) ? repoId : '';
      return load();
    })
    .catch(failed);
}
