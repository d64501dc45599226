// Exports: the caller's own (a list, and one export's place) and the org's (owners and admins), as rows that
// update in place while their exports run.
import { api, ApiError } from "./api.js";
import * as deliveries from "./deliveries.js";
import * as destinations from "./destinations.js";
import { ACTIVE, PAGE_SIZE, current, href, isOverseer, isStaff, pollLater, state } from "./state.js";
import { $, answer, el, failure } from "./ui.js";
import * as words from "./words.js";

/** The kinds that take ticket filters (SPEC §20: the workbook has the CSV's rows, scope and filters). */
const TICKET_KINDS = new Set(["tickets_csv", "tickets_xlsx"]);

/** Still changing on its own: a list that shows it polls (a delivery moves after its export has ended). */
function moving(x) {
  return ACTIVE.has(x.state) || (x.delivery && ["pending", "delivering"].includes(x.delivery.state));
}

// --- what a row says ----------------------------------------------------------------------------------------

function shownState(x) {
  // An owner or admin took the result away: still `completed` in the ledger, but there is nothing to download.
  if (x.state === "completed" && x.errorCode === "export_revoked") return "revoked";
  if (x.state === "completed" && x.expiresAt && Date.parse(x.expiresAt) <= Date.now()) return "expired";
  return x.state;
}

export function title(x) {
  return TICKET_KINDS.has(x.kind) ? `${words.KINDS[x.kind]}: ${words.filters(x.filters)}` : words.KINDS[x.kind] || x.kind;
}

function isMine(x) {
  return !x.creator || x.creator.userId === state.me.id;
}

/** Who reads a row's reason: null (the creator, in their own list) or the org's view of someone's export. */
function viewer(x) {
  if (!x.creator) return null;
  return { isCreator: isMine(x), creatorName: x.creator.name || "A former member" };
}

// A limit's failure keeps the worker's own words (`errorDetail`): which limit, by how much, the setting that raises
// it, and what fits the kind (an archive has no filters to narrow).
const LIMIT_CODES = new Set(["too_many_rows", "too_large", "timeout", "quota_exceeded"]);

function reasonOf(x, shown) {
  if (shown === "expired") return "This export expired: its file can no longer be downloaded. Request a new one.";
  if (x.state === "failed" && LIMIT_CODES.has(x.errorCode) && x.errorDetail) return x.errorDetail;
  if (shown === "revoked" || x.state === "failed" || x.state === "cancelled") {
    return words.reason(x.errorCode, x.kind, viewer(x));
  }
  return "";
}

function requested(x) {
  const by = x.creator ? `by ${isMine(x) ? "you" : x.creator.name || "a former member"}, ` : "";
  const separator = words.delimiter(x);
  return `Requested ${by}${words.when(x.createdAt)}${separator ? ` · ${separator}` : ""}`;
}

function show(node, text) {
  node.textContent = text;
  node.hidden = !text;
}

// --- rows ---------------------------------------------------------------------------------------------------

const LABELS = { download: "Download", cancel: "Cancel", again: "Request a new one", remove: "Delete" };

/**
 * A row of an export list. `list.kind` is "mine" (the caller's own, with every action) or "org" (the org's, with
 * cancel only); `list.place` the list's answer slot; `list.refresh` reloads what the row sits in.
 */
function buildRow(x, list) {
  const li = el("li", { class: "export" });
  li.dataset.id = x.id;
  // Each row's buttons share short names ("Download"); the row's heading describes which export they act on.
  const headId = `${list.prefix}-${x.id}`;
  const head = el("h3", { id: headId });
  const link = list.kind === "mine" && list.linked ? el("a") : null;
  if (link) head.append(link);
  const meta = el("p", { class: "muted meta" });
  const line = el("div", { class: "progress-line" });
  const stateText = el("span", { class: "state" });
  const bar = el("progress", { max: "100", value: "0" });
  const pct = el("span", { class: "pct" });
  line.append(stateText, bar, pct);
  const why = el("p", { class: "reason" });
  const facts = el("p", { class: "facts" });
  const asOf = el("span", { class: "as-of" });
  const expiry = el("span", { class: "expiry" });
  const amount = el("span", { class: "amount" });
  facts.append(asOf, expiry, amount);
  const delivery = deliveries.build(li, headId, list);
  li.append(head, meta, line, why, facts, delivery.line);
  const parts = { head, link, meta, stateText, bar, pct, line, why, facts, asOf, expiry, amount, delivery };
  if (list.kind === "org" || list.details) {
    const details = el("details", { class: "ids" });
    details.append(el("summary", {}, "Details"), el("dl"));
    li.append(details);
    parts.details = details;
  }
  const actions = el("div", { class: "row actions" });
  const buttons = {};
  const names = list.kind === "org" ? ["cancel"] : ["download", "cancel", "again", "remove"];
  for (const name of names) {
    const b = el(
      "button",
      { type: "button", class: name === "download" ? "" : "secondary", "aria-describedby": headId },
      LABELS[name],
    );
    b.addEventListener("click", () => act(name, li, b, list));
    buttons[name] = b;
    actions.append(b);
  }
  actions.append(delivery.open);
  const slot = el("p", { class: "answer", role: "status" });
  li.append(actions, delivery.form, delivery.slot, slot);
  li.parts = { ...parts, buttons, actions, slot };
  return li;
}

function fillRow(li, x, list) {
  li.export = x;
  const p = li.parts;
  const shown = shownState(x);
  if (p.link) {
    p.link.textContent = title(x);
    p.link.href = href("export", state.org.id, x.id);
  } else {
    p.head.textContent = title(x);
  }
  p.meta.textContent = requested(x);
  p.stateText.textContent = words.STATES[shown] || shown;
  p.stateText.className = `state ${shown}`;
  const progress = x.state === "completed" ? 100 : x.progress;
  p.bar.value = progress;
  p.bar.setAttribute("aria-label", `Progress of ${title(x)}`);
  p.pct.textContent = `${progress} %`;
  // A progress bar while it moves, and full once done in the caller's own list; an export that ended without a
  // result has no progress worth a line.
  const bars = ACTIVE.has(x.state) || (list.kind === "mine" && shown === "completed");
  p.bar.hidden = !bars;
  p.pct.hidden = !bars;
  show(p.why, reasonOf(x, shown));
  show(p.asOf, x.snapshotAt ? `Data as of ${words.when(x.snapshotAt)}` : "");
  let expiry = "";
  if (shown === "completed" && x.expiresAt) {
    expiry = `Expires in ${words.duration((Date.parse(x.expiresAt) - Date.now()) / 1000)}`;
  } else if (shown === "expired") {
    expiry = `Expired on ${words.when(x.expiresAt)}`;
  }
  show(p.expiry, expiry);
  show(p.amount, shown === "completed" && x.rowCount !== null ? `${words.count(x.rowCount)}, ${words.size(x.byteSize)}` : "");
  p.facts.hidden = p.asOf.hidden && p.expiry.hidden && p.amount.hidden;
  if (p.details) fillDetails(p.details.querySelector("dl"), x);
  const b = p.buttons;
  b.cancel.hidden = !ACTIVE.has(x.state);
  if (list.kind === "mine") {
    b.download.hidden = !(shown === "completed" && x.canDownload);
    b.again.hidden = !(shown === "expired" || shown === "revoked" || x.state === "failed" || x.state === "cancelled");
    b.remove.hidden = ACTIVE.has(x.state);
  }
  deliveries.fill(p.delivery, x, shown === "completed");
  p.actions.hidden = Object.values(b).every((button) => button.hidden) && p.delivery.open.hidden;
}

// Ids are for those who ask (support, the API): behind a disclosure, never in the sentence.
function fillDetails(dl, x) {
  const facts = [
    ["Export id", x.id],
    ["Scope", x.scope === "own" ? "own tickets only" : "the team's data"],
  ];
  if (x.creator) facts.push(["Requested by (user id)", x.creator.userId]);
  if (x.errorCode) facts.push(["Error code", x.errorCode]);
  if (x.sha256) facts.push(["SHA-256", x.sha256]);
  if (x.byteSize !== null && x.byteSize !== undefined) facts.push(["Bytes", String(x.byteSize)]);
  const key = JSON.stringify(facts);
  if (dl.dataset.key === key) return;
  dl.dataset.key = key;
  dl.replaceChildren(...facts.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]));
}

// Updates rows in place (keyed by export id) so focus stays where it is and nothing jumps while progress moves.
function renderList(node, items, list) {
  const existing = new Map([...node.children].map((li) => [li.dataset.id, li]));
  const rows = items.map((x) => {
    const li = existing.get(x.id) || buildRow(x, list);
    fillRow(li, x, list);
    return li;
  });
  rows.forEach((li, i) => {
    if (node.children[i] !== li) node.insertBefore(li, node.children[i] || null);
  });
  for (const li of [...node.children]) if (!rows.includes(li)) li.remove();
}

/** Repeat an export as it was: the same kind, filters and delimiter. */
export function again(x) {
  const request = { kind: x.kind };
  if (TICKET_KINDS.has(x.kind)) request.filters = x.filters || {};
  if (x.kind === "tickets_csv") request.delimiter = x.delimiter || ",";
  return request;
}

async function act(action, li, button, list) {
  const x = li.export;
  const orgId = state.org.id;
  const slot = li.parts.slot;
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
      answer(slot, "Your download has started.");
    } else if (action === "cancel") {
      await api.deleteExport(orgId, x.id);
      answer(slot, isMine(x) ? "The export was cancelled." : `${x.creator.name}'s export was cancelled.`);
    } else if (action === "remove") {
      await api.deleteExport(orgId, x.id);
      // The row goes: its answer is told where the list is.
      answer(list.place || $("view-answer"), `The export was deleted: ${title(x)}.`);
    } else if (action === "again") {
      const { body } = await api.createExport(orgId, again(x));
      if (list.onAgain) list.onAgain(body);
      answer(list.single ? slot : list.place, `A new export was requested: ${title(x)}. It is first in your exports.`);
    }
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") return list.signOut(error);
    answer(slot, failure(error), true);
  } finally {
    button.disabled = false;
  }
  await list.refresh();
}

// --- a paged list -------------------------------------------------------------------------------------------

/** A list read a page at a time through the API's `next` cursors; "Newer" walks back the cursors it came by. */
class Paged {
  constructor(prefix, fetchPage) {
    this.prefix = prefix;
    this.fetchPage = fetchPage;
    this.cursors = [null]; // the `before` of each page visited; the last is the page shown
    $(`${prefix}-older`).addEventListener("click", () => this.move(1));
    $(`${prefix}-newer`).addEventListener("click", () => this.move(-1));
    this.next = null;
    this.onMove = null;
  }

  reset() {
    this.cursors = [null];
    this.next = null;
  }

  async read() {
    const { body, retryAfter } = await this.fetchPage(this.cursors[this.cursors.length - 1]);
    this.next = body.next;
    return { items: body.items, retryAfter };
  }

  renderPager() {
    $(`${this.prefix}-pager`).hidden = this.cursors.length === 1 && !this.next;
    $(`${this.prefix}-newer`).disabled = this.cursors.length === 1;
    $(`${this.prefix}-older`).disabled = !this.next;
  }

  async move(step) {
    if (step > 0 && this.next) this.cursors.push(this.next);
    else if (step < 0 && this.cursors.length > 1) this.cursors.pop();
    if (this.onMove) await this.onMove();
    $(this.prefix === "exports" ? "mine-title" : "org-exports-title").scrollIntoView({ block: "start" });
  }
}

// --- the caller's exports -------------------------------------------------------------------------------------

let mine = null;
let all = null;
let hooks = { signOut: () => {} };

export function setup(signOut) {
  hooks = { signOut };
  mine = new Paged("exports", (before) => api.exports(state.org.id, PAGE_SIZE, before));
  all = new Paged("org-exports", (before) => api.orgExports(state.org.id, PAGE_SIZE, before));
  $("export-form").addEventListener("submit", requestExport);
  for (const input of document.querySelectorAll('input[name="kind"]')) input.addEventListener("change", syncKind);
}

const MINE = {
  kind: "mine",
  prefix: "export",
  linked: true,
  place: null,
  refresh: () => refreshMine(state.generation),
  onAgain: () => mine.reset(),
  signOut: (e) => hooks.signOut(e),
};

/** The "Your exports" view: the request form and the caller's exports, a page at a time. */
export async function showMine(generation, fresh) {
  MINE.place = $("exports-answer");
  if (fresh) {
    mine.reset();
    $("exports").replaceChildren();
    answer($("export-answer"), "");
    answer($("exports-answer"), "");
  }
  mine.onMove = () => refreshMine(state.generation);
  renderForm();
  await destinations.ensure();
  await refreshMine(generation);
}

// Polls while something is queued or running, as often as the API's Retry-After asks; stops otherwise.
async function refreshMine(generation) {
  let page;
  try {
    page = await mine.read();
  } catch (error) {
    return listFailed(generation, error, $("exports-answer"), () => refreshMine(generation));
  }
  if (!current(generation)) return;
  renderList($("exports"), page.items, MINE);
  $("exports-empty").hidden = page.items.length > 0;
  mine.renderPager();
  if (page.items.some(moving)) pollLater(generation, () => refreshMine(generation), page.retryAfter);
}

function listFailed(generation, error, slot, retry) {
  if (!current(generation)) return;
  if (error instanceof ApiError && error.code === "unauthenticated") return hooks.signOut(error);
  if (error instanceof ApiError && error.retryAfter !== null && error.status >= 429) {
    pollLater(generation, retry, error.retryAfter);
    return;
  }
  answer(slot, `The list could not be read. ${failure(error)}`, true);
}

const MINE_OPTION = $("f-assignment-mine");

function renderForm() {
  const org = state.org;
  // Customers may only request their own tickets: the other choices are not offered at all.
  const staff = isStaff();
  for (const id of ["choice-snapshot", "choice-archive"]) {
    $(id).hidden = !staff;
    $(id).querySelector("input").disabled = !staff;
  }
  if (!staff) $("kind-tickets").checked = true;
  // Tickets are assigned to staff only, so "assigned to me" never matches a customer's tickets (SPEC §4): the
  // choice is not offered to them at all.
  const select = $("f-assignment");
  if (!staff && MINE_OPTION.isConnected) {
    if (select.value === "mine") select.value = "";
    MINE_OPTION.remove();
  } else if (staff && !MINE_OPTION.isConnected) {
    select.insertBefore(MINE_OPTION, select.options[1] || null);
  }
  $("request-export").disabled = org.state === "deleting";
  syncKind();
}

function syncKind() {
  const kind = document.querySelector('input[name="kind"]:checked').value;
  // Both ticket kinds take the filters; only the CSV has a column separator (a workbook's cells are cells).
  const tickets = TICKET_KINDS.has(kind);
  $("csv-options").hidden = !tickets;
  $("csv-options").disabled = !tickets;
  $("delimiter-option").hidden = kind !== "tickets_csv";
  $("f-delimiter").disabled = kind !== "tickets_csv";
}

async function requestExport(event) {
  event.preventDefault();
  if (!state.org) return;
  const kind = document.querySelector('input[name="kind"]:checked').value;
  const request = { kind };
  if (TICKET_KINDS.has(kind)) {
    const filters = {};
    for (const [key, id] of [["status", "f-status"], ["priority", "f-priority"], ["assignment", "f-assignment"]]) {
      if ($(id).value) filters[key] = $(id).value;
    }
    const q = $("f-q").value.trim();
    if (q) filters.q = q;
    request.filters = filters;
    if (kind === "tickets_csv") request.delimiter = $("f-delimiter").value;
  }
  const ok = await submit(request, $("request-export"), $("export-answer"));
  if (ok) {
    answer($("export-answer"), "Export requested. It is built in the background; its progress shows below.");
  }
  mine.reset();
  await refreshMine(state.generation);
}

/** Ask for an export; a refusal is answered in `slot`, beside the control that asked. */
export async function submit(request, button, slot) {
  button.disabled = true;
  try {
    const { body } = await api.createExport(state.org.id, request);
    return body;
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") {
      hooks.signOut(error);
      return null;
    }
    answer(slot, failure(error), true);
    return null;
  } finally {
    button.disabled = state.org.state === "deleting";
  }
}

// --- one export's place (notification emails link here) -------------------------------------------------------

const ONE = {
  kind: "mine",
  prefix: "one",
  details: true,
  single: true,
  place: null,
  refresh: () => refreshOne(state.generation, ONE.exportId),
  signOut: (e) => hooks.signOut(e),
};

export async function showOne(generation, exportId) {
  ONE.exportId = exportId;
  ONE.place = $("view-answer");
  $("one-back").href = href("exports");
  $("one-export").replaceChildren();
  $("one-missing").hidden = true;
  await destinations.ensure();
  await refreshOne(generation, exportId);
}

async function refreshOne(generation, exportId) {
  let x;
  let retryAfter;
  try {
    const found = await api.export(state.org.id, exportId);
    x = found.body;
    retryAfter = found.retryAfter;
  } catch (error) {
    if (!current(generation)) return;
    if (error instanceof ApiError && error.status === 404) {
      $("one-export").replaceChildren();
      $("one-missing").hidden = false;
      $("one-title").textContent = "Export";
      return;
    }
    return listFailed(generation, error, $("view-answer"), () => refreshOne(generation, exportId));
  }
  if (!current(generation)) return;
  $("one-title").textContent = title(x);
  renderList($("one-export"), [x], ONE);
  if (moving(x)) pollLater(generation, () => refreshOne(generation, exportId), retryAfter);
}

// --- the org's exports (owners and admins) --------------------------------------------------------------------

const ALL = {
  kind: "org",
  prefix: "org-export",
  place: null,
  refresh: () => refreshAll(state.generation),
  signOut: (e) => hooks.signOut(e),
};

export async function showAll(generation, fresh) {
  ALL.place = $("org-exports-answer");
  if (fresh) {
    all.reset();
    $("org-exports").replaceChildren();
    answer($("org-exports-answer"), "");
  }
  all.onMove = () => refreshAll(state.generation);
  await destinations.ensure();
  await refreshAll(generation);
}

async function refreshAll(generation) {
  if (!isOverseer()) return;
  let page;
  try {
    page = await all.read();
  } catch (error) {
    return listFailed(generation, error, $("org-exports-answer"), () => refreshAll(generation));
  }
  if (!current(generation)) return;
  renderList($("org-exports"), page.items, ALL);
  $("org-exports-empty").hidden = page.items.length > 0;
  all.renderPager();
  if (page.items.some(moving)) pollLater(generation, () => refreshAll(generation), page.retryAfter);
}

// --- a single export followed in place (the final archive before a deletion) ----------------------------------

/** Follow one export of the caller's in `node` (a list), with its own actions, until it ends. */
export function follow(node, exportId, generation) {
  let followed = exportId;
  const list = {
    kind: "mine",
    prefix: "final",
    single: true,
    place: $("deletion-answer"),
    refresh: () => poll(),
    // Requested again: the new export is the one to follow.
    onAgain: (created) => {
      followed = created.id;
    },
    signOut: (e) => hooks.signOut(e),
  };
  async function poll() {
    let found;
    try {
      found = await api.export(state.org.id, followed);
    } catch (error) {
      if (!current(generation)) return;
      if (error instanceof ApiError && error.status === 404) {
        // Deleted from here: nothing left to follow.
        node.replaceChildren();
        node.hidden = true;
        return;
      }
      return listFailed(generation, error, $("deletion-answer"), poll);
    }
    if (!current(generation)) return;
    node.hidden = false;
    renderList(node, [found.body], list);
    if (ACTIVE.has(found.body.state)) pollLater(generation, poll, found.retryAfter);
  }
  return poll();
}
