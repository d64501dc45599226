// The export center: signing in, the org in view, and which view its address names. Every value it shows comes
// from Space's public API, as for any other client. Views: exports.js, audit.js, settings.js, notifications.js.
import { api, ApiError, signIn, signOut, token } from "./api.js";
import * as audit from "./audit.js";
import * as exports from "./exports.js";
import * as notifications from "./notifications.js";
import * as restore from "./restore.js";
import * as settings from "./settings.js";
import { ME_VIEWS, afterPoll, href, isOverseer, nextGeneration, parse, state } from "./state.js";
import { $, answer, el, failure } from "./ui.js";
import * as words from "./words.js";

const CLOCK_TICK_MS = 30_000;
let clockTimer = null;

// --- signing in and out ---------------------------------------------------------------------------------

async function enter() {
  try {
    state.me = (await api.me()).body;
  } catch (error) {
    signOut();
    $("sign-in-error").textContent = failure(error);
    $("token").focus();
    return;
  }
  $("sign-in").hidden = true;
  $("center").hidden = false;
  $("who").hidden = false;
  $("who-name").textContent = `Signed in as ${state.me.name}`;
  $("sign-in-error").textContent = "";
  // Relative times ("expires in 3 h") move on while nothing else changes: the view is read again now and then.
  clockTimer = setInterval(() => route(false), CLOCK_TICK_MS);
  try {
    await loadOrgs();
  } catch (error) {
    answer($("view-answer"), failure(error), true);
    return;
  }
  await route(true);
}

function leave(message = "") {
  signOut();
  nextGeneration();
  clearInterval(clockTimer);
  Object.assign(state, { me: null, orgs: [], org: null, role: null, members: [] });
  $("center").hidden = true;
  $("who").hidden = true;
  $("sign-in").hidden = false;
  $("token").value = "";
  for (const id of ["exports", "org-exports", "audit-items", "one-export", "org", "member-items", "webhook-items"]) {
    $(id).replaceChildren();
  }
  notifications.reset();
  answer($("view-answer"), "");
  $("sign-in-error").textContent = message;
  $("token").focus();
}

function expired(error) {
  leave(error instanceof ApiError ? "Your token is no longer accepted. Sign in again." : "");
}

// --- organizations ----------------------------------------------------------------------------------------

async function loadOrgs() {
  const { body } = await api.orgs();
  state.orgs = body.items;
  $("org").replaceChildren(...state.orgs.map((o) => el("option", { value: o.id }, o.name)));
  $("org-pick").hidden = state.orgs.length === 0;
}

/** Read the org and the caller's role in it; false when it is none of theirs. */
async function loadOrg(orgId) {
  state.org = null;
  const [org, members] = await Promise.all([api.org(orgId), api.members(orgId)]);
  state.org = org.body;
  state.members = members.body.items;
  const mine = state.members.find((m) => m.userId === state.me.id);
  state.role = mine ? mine.role : null;
  $("org").value = orgId;
}

function renderOrg() {
  const org = state.org;
  const role = state.role;
  $("org-role").textContent = `You are ${words.ROLE_IN_SENTENCE[role] || role} of ${org.name}.`;
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
  for (const tab of document.querySelectorAll("#tabs a[data-view]")) tab.href = href(tab.dataset.view);
  $("tab-all").parentElement.hidden = !isOverseer();
  $("tab-audit").parentElement.hidden = !isOverseer();
  $("request-export").disabled = org.state === "deleting";
}

// --- views ------------------------------------------------------------------------------------------------

let shown = { key: null };
let pending = null; // an answer for the next view (an action that moved to another address)

function showView(name) {
  for (const node of document.querySelectorAll("[data-view]")) {
    if (node.tagName !== "A") node.hidden = node.dataset.view !== name;
  }
  for (const tab of document.querySelectorAll("#tabs a")) {
    if (tab.dataset.view === name) tab.setAttribute("aria-current", "page");
    else tab.removeAttribute("aria-current");
  }
  $("org-bar").hidden = (state.orgs.length === 0 && name === "new-org") || (ME_VIEWS.has(name) && !state.org);
  if (name === "notifications") $("bell").setAttribute("aria-current", "page");
  else $("bell").removeAttribute("aria-current");
}

// A new view takes the focus to its heading: a screen reader says where the reader now is, and Tab goes on from
// there instead of from a link that may have been hidden.
function focusView(name) {
  const heading = document.querySelector(`[data-view="${name}"]:not(a) h2`);
  if (!heading) return;
  heading.tabIndex = -1;
  heading.focus({ preventScroll: true });
}

const TITLES = {
  exports: "Your exports",
  export: "Export",
  all: "All exports",
  audit: "Audit trail",
  settings: "Settings",
  "new-org": "New organization",
  notifications: "Notifications",
  preferences: "Email preferences",
};

/** Show what the address names. `fresh`: the address changed (not a clock tick): start the view anew. */
async function route(fresh = true) {
  if (!state.me) return;
  let target = parse(location.hash);
  if (!target) {
    if (!state.orgs.length) target = { view: "new-org" };
    else target = { view: "exports", orgId: state.orgs[0].id };
    history.replaceState(null, "", target.view === "new-org" ? href("new-org") : href("exports", target.orgId));
  }
  const key = `${target.view}/${target.orgId}/${target.exportId || target.importId}`;
  if (!fresh && shown.key !== key) return;
  const generation = nextGeneration();
  if (fresh) answer($("view-answer"), pending || "");
  pending = null;
  // Every view, and every clock tick, reads the unread count again.
  notifications.refreshCount();
  if (ME_VIEWS.has(target.view)) return routeMine(target.view, key, generation, fresh);
  if (target.view === "new-org") {
    shown = { key };
    $("no-orgs").hidden = state.orgs.length > 0;
    $("banner").hidden = true;
    showView("new-org");
    // An import's address (a notification's link) shows its report beside the restore form.
    if (fresh && target.importId) await restore.show(target.importId, generation);
    else if (fresh) $("new-org-name").focus();
    return;
  }
  if (fresh || !state.org || state.org.id !== target.orgId) {
    try {
      await loadOrg(target.orgId);
    } catch (error) {
      if (generation !== state.generation) return;
      if (error instanceof ApiError && error.code === "unauthenticated") return expired(error);
      showView(null);
      answer($("view-answer"), error instanceof ApiError && error.status === 404
        ? "This organization does not exist, or you are not a member of it."
        : failure(error), true);
      return;
    }
    if (generation !== state.generation) return;
  }
  let view = target.view;
  // Owners' and admins' views are not offered to others; their address leads to the caller's own exports.
  if ((view === "all" || view === "audit") && !isOverseer()) view = "exports";
  shown = { key };
  renderOrg();
  showView(view);
  document.title = `${TITLES[view]} · ${state.org.name} · Space`;
  if (fresh) focusView(view);
  if (view === "exports") await exports.showMine(generation, fresh);
  else if (view === "export") await exports.showOne(generation, target.exportId);
  else if (view === "all") await exports.showAll(generation, fresh);
  // A clock tick leaves the trail as it is (older pages the reader opened stay open).
  else if (view === "audit" && fresh) await audit.show(generation);
  else if (view === "settings" && fresh) await settings.show(generation);
}

/** The caller's own views (`#/me/...`): not an org's, though the org's tabs stay at hand to go back to. */
async function routeMine(view, key, generation, fresh) {
  shown = { key };
  if (!state.org && state.orgs.length) {
    try {
      await loadOrg(state.orgs[0].id);
    } catch {
      // Only the tabs depend on it: they stay hidden.
    }
    if (generation !== state.generation) return;
  }
  if (state.org) renderOrg();
  $("banner").hidden = true;
  showView(view);
  document.title = `${TITLES[view]} · Space`;
  if (!fresh) return;
  focusView(view);
  if (view === "notifications") await notifications.showNotifications(generation);
  else await notifications.showPreferences(generation);
}

// An org's state changed (suspended, deleting...): the banner and the controls follow.
function orgChanged() {
  const i = state.orgs.findIndex((o) => o.id === state.org.id);
  if (i >= 0) state.orgs[i] = state.org;
  renderOrg();
}

async function createOrg(event) {
  event.preventDefault();
  const name = $("new-org-name").value.trim();
  const slot = $("new-org-answer");
  if (!name) {
    answer(slot, "Give the organization a name.", true);
    return;
  }
  $("create-org").disabled = true;
  try {
    const { body } = await api.createOrg(name);
    $("new-org-name").value = "";
    answer(slot, "");
    await loadOrgs();
    pending = `${body.name} was created and you are its owner.`;
    location.hash = href("exports", body.id);
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") return expired(error);
    answer(slot, failure(error), true);
  } finally {
    $("create-org").disabled = false;
  }
}

// --- wiring -----------------------------------------------------------------------------------------------

exports.setup(expired);
audit.setup(expired);
settings.setup(expired, orgChanged);
notifications.setup(expired);
// A restored org joins the caller's list at once (the answer beside the form says what came back).
restore.setup(expired, () => loadOrgs());
afterPoll(notifications.refreshCount);

$("sign-in-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const value = $("token").value.trim();
  if (!value) return;
  signIn(value);
  $("token").value = "";
  await enter();
});
$("sign-out").addEventListener("click", () => leave("You are signed out."));
$("org").addEventListener("change", () => {
  // The same view of the other org (the caller's exports when that view is not theirs there).
  const target = parse(location.hash);
  const view =
    target && target.view !== "export" && target.view !== "new-org" && !ME_VIEWS.has(target.view) ? target.view : "exports";
  location.hash = href(view, $("org").value);
});
$("new-org-form").addEventListener("submit", createOrg);
$("tab-new-org").href = href("new-org");
window.addEventListener("hashchange", () => route(true));

if (token()) enter();
else $("token").focus();
