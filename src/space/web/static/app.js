// The export center: every value it shows comes from Space's public API, as for any other client.
import { api, ApiError, signIn, signOut, token } from "./api.js";
import * as words from "./words.js";

const $ = (id) => document.getElementById(id);
const ACTIVE = new Set(["queued", "running"]);
const STAFF = new Set(["owner", "admin", "member"]);
const DEFAULT_POLL_SECONDS = 1;
const CLOCK_TICK_MS = 30_000;

const view = {
  me: null,
  orgs: [],
  org: null,
  role: null,
  exports: [],
  orgExports: [],
  pollTimer: null,
  clockTimer: null,
  auditNext: null,
  generation: 0, // bumped on sign-out and org change: answers of an earlier view are dropped
};

function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  if (text !== undefined) node.textContent = text;
  return node;
}

function notice(text, bad = false) {
  const n = $("notice");
  n.textContent = text;
  n.classList.toggle("bad", bad);
}

function explain(error) {
  if (error instanceof ApiError) {
    if (error.code === "unauthenticated") {
      leave("Your token is no longer accepted. Sign in again.");
      return;
    }
    notice(words.problem(error), true);
  } else {
    notice("The server could not be reached. Try again.", true);
  }
}

// --- signing in and out ---------------------------------------------------------------------------------

async function enter() {
  try {
    view.me = (await api.me()).body;
  } catch (error) {
    signOut();
    $("sign-in-error").textContent =
      error instanceof ApiError ? words.problem(error) : "The server could not be reached. Try again.";
    $("token").focus();
    return;
  }
  $("sign-in").hidden = true;
  $("center").hidden = false;
  $("who").hidden = false;
  $("who-name").textContent = `Signed in as ${view.me.name}`;
  $("sign-in-error").textContent = "";
  view.clockTimer = setInterval(renderAll, CLOCK_TICK_MS);
  try {
    await loadOrgs();
  } catch (error) {
    explain(error);
  }
}

function leave(message = "") {
  signOut();
  view.generation += 1;
  clearTimeout(view.pollTimer);
  clearInterval(view.clockTimer);
  Object.assign(view, { me: null, orgs: [], org: null, role: null, exports: [], orgExports: [], auditNext: null });
  $("center").hidden = true;
  $("who").hidden = true;
  $("sign-in").hidden = false;
  $("token").value = "";
  $("exports").replaceChildren();
  $("org-exports").replaceChildren();
  $("audit-items").replaceChildren();
  $("org").replaceChildren();
  notice("");
  $("sign-in-error").textContent = message;
  $("token").focus();
}

// --- organizations ----------------------------------------------------------------------------------------

async function loadOrgs(selectId) {
  const { body } = await api.orgs();
  view.orgs = body.items;
  const select = $("org");
  select.replaceChildren(...view.orgs.map((o) => el("option", { value: o.id }, o.name)));
  $("no-orgs").hidden = view.orgs.length > 0;
  if (!view.orgs.length) return;
  const id = selectId && view.orgs.some((o) => o.id === selectId) ? selectId : view.orgs[0].id;
  select.value = id;
  await loadOrg(id);
}

async function loadOrg(orgId) {
  view.generation += 1;
  clearTimeout(view.pollTimer);
  // Nothing can be requested of an org until the page knows its state and the caller's role in it.
  view.org = null;
  $("request-export").disabled = true;
  const generation = view.generation;
  notice("");
  $("final-export").hidden = true;
  try {
    const [org, members] = await Promise.all([api.org(orgId), api.members(orgId)]);
    if (generation !== view.generation) return;
    view.org = org.body;
    const mine = members.body.items.find((m) => m.userId === view.me.id);
    view.role = mine ? mine.role : null;
  } catch (error) {
    explain(error);
    return;
  }
  view.exports = [];
  view.orgExports = [];
  $("exports").replaceChildren();
  $("org-exports").replaceChildren();
  renderOrg();
  await refresh();
  if (isOverseer()) await loadAudit(true);
}

function isOverseer() {
  return view.role === "owner" || view.role === "admin";
}

function renderOrg() {
  const org = view.org;
  const role = view.role;
  $("org-role").textContent = `You are ${words.ROLES[role] || role} of ${org.name}.`;
  const banner = $("banner");
  banner.className = "banner";
  if (org.state === "suspended") {
    banner.hidden = false;
    banner.classList.add("suspended");
    banner.textContent =
      "This organization is suspended: its data can be read and exported, but not changed. An owner can reactivate it.";
  } else if (org.state === "deleting") {
    banner.hidden = false;
    banner.classList.add("deleting");
    const after = org.deleteAfter
      ? ` It will be purged on ${words.when(org.deleteAfter)} (in ${words.duration((Date.parse(org.deleteAfter) - Date.now()) / 1000)}).`
      : "";
    banner.textContent = `This organization is being deleted.${after} New exports and downloads are stopped; an owner can cancel the deletion until then.`;
  } else {
    banner.hidden = true;
    banner.textContent = "";
  }

  // Customers may only request their own tickets: the other choices are not offered at all.
  const staff = STAFF.has(role);
  for (const id of ["choice-snapshot", "choice-archive"]) {
    $(id).hidden = !staff;
    $(id).querySelector("input").disabled = !staff;
  }
  if (!staff) $("kind-tickets").checked = true;
  $("request-export").disabled = org.state === "deleting";
  syncKind();

  const owner = role === "owner";
  $("owner").hidden = !owner;
  $("suspend").hidden = org.state !== "active";
  $("reactivate").hidden = org.state !== "suspended";
  $("cancel-deletion").hidden = org.state !== "deleting";
  $("deletion-form").hidden = org.state === "deleting";
  if (org.state === "deleting") $("final-export").hidden = true;

  $("oversight").hidden = !isOverseer();
  $("audit").hidden = !isOverseer();
}

function syncKind() {
  const kind = document.querySelector('input[name="kind"]:checked').value;
  const csv = kind === "tickets_csv";
  $("csv-options").hidden = !csv;
  $("csv-options").disabled = !csv;
}

// --- exports ----------------------------------------------------------------------------------------------

// Polls while something is queued or running, as often as the API's Retry-After asks; stops otherwise.
async function refresh() {
  clearTimeout(view.pollTimer);
  if (!view.org) return;
  const generation = view.generation;
  const orgId = view.org.id;
  let wait = null;
  try {
    const mine = await api.exports(orgId);
    if (generation !== view.generation) return;
    view.exports = mine.body.items;
    wait = mine.retryAfter;
    if (isOverseer()) {
      const all = await api.orgExports(orgId);
      if (generation !== view.generation) return;
      view.orgExports = all.body.items;
      wait = wait ?? all.retryAfter;
    }
  } catch (error) {
    if (generation !== view.generation) return;
    if (error instanceof ApiError && error.retryAfter !== null && error.status >= 429) {
      view.pollTimer = setTimeout(refresh, error.retryAfter * 1000);
      return;
    }
    explain(error);
    return;
  }
  renderAll();
  const running = [...view.exports, ...view.orgExports].some((x) => ACTIVE.has(x.state));
  if (running) view.pollTimer = setTimeout(refresh, (wait ?? DEFAULT_POLL_SECONDS) * 1000);
}

function renderAll() {
  if (!view.org) return;
  renderList($("exports"), view.exports, false);
  $("exports-empty").hidden = view.exports.length > 0;
  if (isOverseer()) {
    renderList($("org-exports"), view.orgExports, true);
    $("org-exports-empty").hidden = view.orgExports.length > 0;
  }
}

function shownState(x) {
  // An owner or admin took the result away: still `completed` in the ledger, but there is nothing to download.
  if (x.state === "completed" && x.errorCode === "export_revoked") return "revoked";
  if (x.state === "completed" && x.expiresAt && Date.parse(x.expiresAt) <= Date.now()) return "expired";
  return x.state;
}

function title(x) {
  return x.kind === "tickets_csv" ? `${words.KINDS[x.kind]}: ${words.filters(x.filters)}` : words.KINDS[x.kind] || x.kind;
}

// Updates rows in place (keyed by export id) so focus stays where it is and nothing jumps while progress moves.
function renderList(list, items, oversight) {
  const existing = new Map([...list.children].map((li) => [li.dataset.id, li]));
  const rows = items.map((x) => {
    const li = existing.get(x.id) || buildRow(x, oversight);
    fillRow(li, x, oversight);
    return li;
  });
  rows.forEach((li, i) => {
    if (list.children[i] !== li) list.insertBefore(li, list.children[i] || null);
  });
  for (const li of [...list.children]) if (!rows.includes(li)) li.remove();
}

function buildRow(x, oversight) {
  const li = el("li", { class: "export" });
  li.dataset.id = x.id;
  // Each row's buttons share short names ("Download"); the row's heading describes which export they act on.
  const headId = `${oversight ? "org-export" : "export"}-${x.id}`;
  const head = el("h3", { id: headId });
  const meta = el("p", { class: "muted meta" });
  const line = el("div", { class: "progress-line" });
  const state = el("span", { class: "state" });
  const bar = el("progress", { max: "100", value: "0" });
  const pct = el("span", { class: "pct" });
  line.append(state, bar, pct);
  const why = el("p", { class: "reason" });
  const facts = el("div", { class: "facts" });
  const asOf = el("p", { class: "as-of" });
  const expiry = el("p", { class: "expiry" });
  const amount = el("p", { class: "amount" });
  facts.append(asOf, expiry, amount);
  const actions = el("div", { class: "row" });
  const buttons = {};
  const names = oversight ? ["cancel"] : ["download", "cancel", "again", "remove"];
  const labels = { download: "Download", cancel: "Cancel", again: "Request a new one", remove: "Delete" };
  for (const name of names) {
    const b = el(
      "button",
      { type: "button", class: name === "download" ? "" : "secondary", "aria-describedby": headId },
      labels[name],
    );
    b.dataset.action = name;
    b.addEventListener("click", () => act(name, li.export, b));
    buttons[name] = b;
    actions.append(b);
  }
  li.append(head, meta, line, why, facts, actions);
  li.parts = { head, meta, state, bar, pct, why, asOf, expiry, amount, buttons };
  return li;
}

function fillRow(li, x, oversight) {
  li.export = x;
  const p = li.parts;
  const shown = shownState(x);
  p.head.textContent = title(x);
  const by = oversight ? `by ${x.creator ? x.creator.name : "a former member"}, ` : "";
  p.meta.textContent = `Requested ${by}${words.when(x.createdAt)}`;
  p.state.textContent = words.STATES[shown] || shown;
  p.state.className = `state ${shown}`;
  const progress = x.state === "completed" ? 100 : x.progress;
  p.bar.value = progress;
  p.bar.setAttribute("aria-label", `Progress of ${title(x)}`);
  p.pct.textContent = `${progress} %`;
  let reason = "";
  if (shown === "expired") reason = "This export expired: its file can no longer be downloaded. Request a new one.";
  else if (shown === "revoked") reason = words.reason(x.errorCode) || "";
  else if (x.state === "failed" || x.state === "cancelled") reason = words.reason(x.errorCode) || "";
  p.why.textContent = reason;
  p.asOf.textContent = x.snapshotAt ? `Data as of ${words.when(x.snapshotAt)}` : "";
  if (shown === "completed" && x.expiresAt) {
    p.expiry.textContent = `Expires in ${words.duration((Date.parse(x.expiresAt) - Date.now()) / 1000)}`;
  } else if (shown === "expired") {
    p.expiry.textContent = `Expired on ${words.when(x.expiresAt)}`;
  } else {
    p.expiry.textContent = "";
  }
  p.amount.textContent =
    shown === "completed" && x.rowCount !== null ? `${words.count(x.rowCount)}, ${words.size(x.byteSize)}` : "";
  const b = p.buttons;
  b.cancel.hidden = !ACTIVE.has(x.state);
  if (!oversight) {
    b.download.hidden = !(shown === "completed" && x.canDownload);
    b.again.hidden = !(shown === "expired" || shown === "revoked" || x.state === "failed" || x.state === "cancelled");
    b.remove.hidden = ACTIVE.has(x.state);
  }
}

async function act(action, x, button) {
  const orgId = view.org.id;
  button.disabled = true;
  try {
    if (action === "download") {
      const { body } = await api.link(orgId, x.id);
      // A native download of a short-lived link: the browser streams the file to disk, never into memory here.
      const a = el("a", { href: body.url, download: "" });
      a.hidden = true;
      document.body.append(a);
      a.click();
      a.remove();
      notice("Your download has started.");
    } else if (action === "cancel") {
      await api.deleteExport(orgId, x.id);
      notice("The export was cancelled.");
    } else if (action === "remove") {
      await api.deleteExport(orgId, x.id);
      notice("The export was deleted.");
    } else if (action === "again") {
      const request = { kind: x.kind };
      if (x.kind === "tickets_csv") {
        request.filters = x.filters || {};
        request.delimiter = $("f-delimiter").value;
      }
      await api.createExport(orgId, request);
      notice("A new export was requested.");
    }
  } catch (error) {
    explain(error);
  } finally {
    button.disabled = false;
  }
  await refresh();
}

async function requestExport(event) {
  event.preventDefault();
  if (!view.org) return;
  const kind = document.querySelector('input[name="kind"]:checked').value;
  const request = { kind };
  if (kind === "tickets_csv") {
    const filters = {};
    for (const [key, id] of [["status", "f-status"], ["priority", "f-priority"], ["assignment", "f-assignment"]]) {
      if ($(id).value) filters[key] = $(id).value;
    }
    const q = $("f-q").value.trim();
    if (q) filters.q = q;
    request.filters = filters;
    request.delimiter = $("f-delimiter").value;
  }
  await submitExport(request, "Export requested. It is built in the background; its progress shows below.");
}

async function submitExport(request, message) {
  const button = $("request-export");
  button.disabled = true;
  let ok = false;
  try {
    await api.createExport(view.org.id, request);
    notice(message);
    ok = true;
  } catch (error) {
    explain(error);
  } finally {
    button.disabled = view.org.state === "deleting";
  }
  await refresh();
  return ok;
}

// --- audit trail (owners and admins) ----------------------------------------------------------------------

const ACTIONS = {
  "export.requested": "requested an export",
  "export.completed": "export completed",
  "export.failed": "export failed",
  "export.cancelled": "cancelled an export",
  "export.link_created": "created a download link",
  "export.downloaded": "downloaded an export",
  "member.added": "added a member",
  "member.role_changed": "changed a member's role",
  "member.removed": "removed a member",
  "org.suspended": "suspended the organization",
  "org.reactivated": "reactivated the organization",
  "org.deletion_requested": "requested the organization's deletion",
  "org.deletion_cancelled": "cancelled the organization's deletion",
};

async function loadAudit(first) {
  const generation = view.generation;
  const list = $("audit-items");
  if (first) {
    list.replaceChildren();
    view.auditNext = null;
  }
  try {
    const { body } = await api.audit(view.org.id, first ? null : view.auditNext);
    if (generation !== view.generation) return;
    for (const item of body.items) {
      const who = item.actor ? item.actor.name : "Space";
      const what = ACTIONS[item.action] || item.action;
      const details = item.details && Object.keys(item.details).length ? ` (${JSON.stringify(item.details)})` : "";
      const target = item.target ? ` · ${item.target.type} ${item.target.id}` : "";
      const li = el("li");
      li.append(el("time", { datetime: item.at }, words.when(item.at)), ` ${who} ${what}${target}${details}`);
      list.append(li);
    }
    view.auditNext = body.next;
    $("audit-more").hidden = !body.next;
  } catch (error) {
    if (generation !== view.generation) return;
    $("audit-more").hidden = true;
    list.replaceChildren(el("li", { class: "muted" }, `The audit trail could not be read. ${words.problem(error)}`));
  }
}

// --- the organization's lifecycle (owners) ----------------------------------------------------------------

async function lifecycle(run, message) {
  try {
    const { body } = await run();
    view.org = body;
    renderOrg();
    notice(message);
    await refresh();
    if (isOverseer()) await loadAudit(true); // the trail now holds this change
  } catch (error) {
    explain(error);
  }
}

async function requestDeletion(skipFinalExport) {
  const confirm = $("confirm-name").value;
  if (confirm !== view.org.name) {
    notice(`To confirm, type the organization's name exactly: ${view.org.name}`, true);
    $("confirm-name").focus();
    return;
  }
  try {
    const { body } = await api.requestDeletion(view.org.id, confirm, skipFinalExport);
    view.org = body;
    $("final-export").hidden = true;
    $("confirm-name").value = "";
    renderOrg();
    notice("Deletion requested. You can cancel it until the purge.");
    await refresh();
    if (isOverseer()) await loadAudit(true);
  } catch (error) {
    if (error instanceof ApiError && error.code === "final_export_recommended") {
      $("final-export").hidden = false;
      notice(words.problem(error), true);
      $("export-everything").focus();
      return;
    }
    explain(error);
  }
}

// --- wiring -----------------------------------------------------------------------------------------------

$("sign-in-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const value = $("token").value.trim();
  if (!value) return;
  signIn(value);
  $("token").value = "";
  await enter();
});
$("sign-out").addEventListener("click", () => leave("You are signed out."));
$("org").addEventListener("change", () => loadOrg($("org").value));
$("export-form").addEventListener("submit", requestExport);
for (const input of document.querySelectorAll('input[name="kind"]')) input.addEventListener("change", syncKind);
$("audit-more").addEventListener("click", () => loadAudit(false));
$("suspend").addEventListener("click", () =>
  lifecycle(() => api.suspend(view.org.id), "The organization is suspended."),
);
$("reactivate").addEventListener("click", () =>
  lifecycle(() => api.reactivate(view.org.id), "The organization is active again."),
);
$("cancel-deletion").addEventListener("click", () =>
  lifecycle(() => api.cancelDeletion(view.org.id), "The deletion was cancelled."),
);
$("deletion-form").addEventListener("submit", (event) => {
  event.preventDefault();
  requestDeletion(false);
});
$("delete-anyway").addEventListener("click", () => requestDeletion(true));
$("export-everything").addEventListener("click", async () => {
  const ok = await submitExport(
    { kind: "archive" },
    "An archive of everything is being built. When it is ready, download it, then request the deletion again.",
  );
  if (ok) $("final-export").hidden = true;
});

if (token()) enter();
else $("token").focus();
