// What the page knows about the signed-in person and the org in view, and the addresses of its views.

export const ACTIVE = new Set(["queued", "running"]);
export const STAFF = new Set(["owner", "admin", "member"]);
export const PAGE_SIZE = 10; // exports per page of a list: a phone shows a page in a few screen heights
export const DEFAULT_POLL_SECONDS = 1;

export const state = {
  me: null,
  orgs: [],
  org: null,
  role: null,
  members: [],
  pollTimer: null,
  // Bumped on every change of view, org or sign-in: answers that arrive for an earlier view are dropped.
  generation: 0,
};

export function isOverseer() {
  return state.role === "owner" || state.role === "admin";
}

export function isStaff() {
  return STAFF.has(state.role);
}

/** Start a new view: stop the previous one's polling; its late answers no longer count. */
export function nextGeneration() {
  state.generation += 1;
  clearTimeout(state.pollTimer);
  return state.generation;
}

export function current(generation) {
  return generation === state.generation;
}

const afterPolls = [];

/** Call `fn` after every poll has read its answer (the notifications count follows the exports' polling). */
export function afterPoll(fn) {
  afterPolls.push(fn);
}

/** Poll `fn` again after `seconds` (the API's Retry-After when it gave one), for this view only. */
export function pollLater(generation, fn, seconds) {
  if (!current(generation)) return;
  clearTimeout(state.pollTimer);
  state.pollTimer = setTimeout(() => {
    if (!current(generation)) return;
    // After the poll, not beside it: the poll that sees an export end must be followed by a count that has it.
    Promise.resolve(fn()).finally(() => {
      for (const hook of afterPolls) hook();
    });
  }, (seconds ?? DEFAULT_POLL_SECONDS) * 1000);
}

/** The caller's own views, not an org's: `#/me/<view>`. */
export const ME_VIEWS = new Set(["notifications", "preferences"]);

/** The address of a view of an org: `#/orgs/<orgId>/<view>[/<exportId>]` (or the caller's own, `#/me/<view>`). */
export function href(view, orgId = state.org && state.org.id, exportId = null) {
  if (view === "new-org") return "#/orgs/new";
  if (ME_VIEWS.has(view)) return `#/me/${view}`;
  if (view === "export") return `#/orgs/${orgId}/exports/${exportId}`;
  return `#/orgs/${orgId}/${view}`;
}

const VIEWS = new Set(["exports", "all", "audit", "settings"]);

/** The address of one of the caller's imports (SPEC §23): shown in the New organization view, beside the restore. */
export function importHref(importId) {
  return `#/imports/${encodeURIComponent(importId)}`;
}

/** What an address asks for: {view, orgId?, exportId?, importId?}; null for an address that is no view. */
export function parse(hash) {
  const parts = hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts.length === 2 && parts[0] === "orgs" && parts[1] === "new") return { view: "new-org" };
  if (parts.length === 2 && parts[0] === "imports") return { view: "new-org", importId: parts[1] };
  if (parts.length === 2 && parts[0] === "me" && ME_VIEWS.has(parts[1])) return { view: parts[1] };
  if (parts[0] !== "orgs" || parts.length < 2) return null;
  const orgId = parts[1];
  if (parts.length === 2) return { view: "exports", orgId };
  if (parts.length === 3 && VIEWS.has(parts[2])) return { view: parts[2], orgId };
  if (parts.length === 4 && parts[2] === "exports") return { view: "export", orgId, exportId: parts[3] };
  return null;
}
