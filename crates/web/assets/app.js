// @ts-check
/**
 * The entry point of every page: sign-in (a token kept in this browser), sign-out, the
 * navigation, and the page the path names.
 */
import { ApiError, forgetToken, keepToken, role, token, tokenName, whenUnauthenticated, whoIs } from './api.js';
import { byId, fill, h } from './dom.js';
import { costsPage } from './costs.js';
import { issuesPage } from './issues.js';
import { taskPage } from './task.js';
import { settingsPage } from './settings.js';

const main = byId('main');
const dialog = /** @type {HTMLDialogElement} */ (byId('sign-in'));
const form = /** @type {HTMLFormElement} */ (byId('sign-in-form'));
const input = /** @type {HTMLInputElement} */ (byId('sign-in-token'));
const error = byId('sign-in-error');
const why = byId('sign-in-why');
const session = byId('session');

const UUID = /^\/tasks\/([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$/;

/** Draws the page of the current path. */
function route() {
  const path = location.pathname.replace(/\/+$/, '') || '/';
  for (const a of document.querySelectorAll('nav a')) {
    const here = path === a.getAttribute('href') || (path.startsWith('/tasks/') && a.getAttribute('href') === '/costs');
    if (path === a.getAttribute('href')) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
    a.classList.toggle('current', here);
  }
  const task = UUID.exec(path);
  if (path === '/costs' || path === '/' || path.endsWith('/index.html')) costsPage(main);
  else if (path === '/issues') issuesPage(main);
  else if (path === '/settings') settingsPage(main);
  else if (task) taskPage(main, task[1]);
  else fill(main, h('h1', {}, 'Not found'), h('p', {}, 'There is no page here. ', h('a', { href: '/costs' }, 'Go to the costs.')));
}

function showSession() {
  const r = role();
  session.hidden = r === null;
  const name = tokenName();
  byId('session-role').textContent = r ? `Signed in${name ? ` as ${name}` : ''} (${r})` : '';
}

/**
 * Shows the sign-in prompt (again), with why.
 * @param {string} [message]
 */
function askForToken(message) {
  session.hidden = true;
  main.dataset.ready = 'signed-out';
  error.textContent = message ?? '';
  why.textContent = 'Paste an agentry API token. It stays in this browser until you sign out.';
  input.value = '';
  if (!dialog.open) dialog.showModal();
  input.focus();
}

form.addEventListener('submit', async (e) => {
  e.preventDefault();
  const candidate = input.value.trim();
  if (!candidate) {
    error.textContent = 'Enter a token.';
    return;
  }
  error.textContent = '';
  const button = /** @type {HTMLButtonElement} */ (form.querySelector('button'));
  button.disabled = true;
  try {
    keepToken(candidate, await whoIs(candidate));
    dialog.close();
    showSession();
    route();
  } catch (err) {
    error.textContent =
      err instanceof ApiError && err.status === 401
        ? 'The API refused this token: ' + err.message
        : err instanceof ApiError
          ? err.message
          : 'The API could not be reached.';
    input.focus();
  } finally {
    button.disabled = false;
  }
});

// The prompt cannot be dismissed without a token: every page needs one.
dialog.addEventListener('cancel', (e) => {
  if (!token()) e.preventDefault();
});

byId('sign-out').addEventListener('click', () => {
  forgetToken();
  fill(main);
  askForToken('Signed out.');
});

whenUnauthenticated((message) => askForToken(message));

async function start() {
  const t = token();
  if (!t) {
    fill(main);
    askForToken();
    return;
  }
  // The role decides what a page offers: asked once (`GET /api/me`), kept with the token.
  if (!role()) {
    try {
      keepToken(t, await whoIs(t));
    } catch (err) {
      forgetToken();
      askForToken(err instanceof ApiError ? err.message : 'The API could not be reached.');
      return;
    }
  }
  showSession();
  route();
}

void start();
