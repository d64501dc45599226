// The caller's own views: what they were told (notifications, with the unread count in the header) and which of
// it is also emailed to them (preferences). Both are the caller's across every org, at `#/me/...`.
import { api, ApiError } from "./api.js";
import { current, href, importHref, state } from "./state.js";
import { $, answer, el, failure } from "./ui.js";
import * as words from "./words.js";

const PAGE = 20; // notifications a page: "Older notifications" adds the next one below
let hooks = { signOut: () => {} };
let next = null;
let counting = null; // the count being read, so that polls arriving together ask once
let again = false; // asked while a count was being read: read once more after it (it may predate an action)
let shownAt = 0; // when the count shown was read: an older answer arriving late does not replace it

export function setup(signOut) {
  hooks = { signOut };
  // Addresses are made in one place (state.href), as the tabs' are.
  $("bell").href = href("notifications");
  $("back-to-notifications").href = href("notifications");
  $("to-preferences").href = href("preferences");
  $("read-all").addEventListener("click", readAll);
  $("notifications-older").addEventListener("click", older);
  $("preferences-form").addEventListener("submit", savePreferences);
}

function unauthenticated(error) {
  return error instanceof ApiError && error.code === "unauthenticated";
}

/** Show the unread count in the header's control (seen as a badge, heard in the control's name). */
function renderCount(unread, readAt = performance.now()) {
  if (readAt < shownAt) return;
  shownAt = readAt;
  const badge = $("bell-count");
  badge.hidden = !unread;
  badge.textContent = unread ? String(unread) : "";
  $("bell").setAttribute("aria-label", words.notificationsLabel(unread));
}

/** Read the unread count again (after the page loads, an action, or a poll of the exports). */
export function refreshCount() {
  if (!state.me) return Promise.resolve();
  if (counting) {
    again = true;
    return counting;
  }
  const asked = performance.now();
  counting = api
    .notifications(1)
    .then(({ body }) => {
      if (state.me) renderCount(body.unread, asked);
    })
    .catch((error) => {
      if (unauthenticated(error)) hooks.signOut(error);
      // Otherwise the count stays as it was: the next refresh tries again.
    })
    .finally(() => {
      counting = null;
      if (again) {
        again = false;
        refreshCount();
      }
    });
  return counting;
}

export function reset() {
  renderCount(0);
  shownAt = 0;
  next = null;
  $("notification-items").replaceChildren();
  $("preference-items").replaceChildren();
}

/** Where a notification leads: the export's place, the org's settings for a deletion or a paused schedule, else the
 * org; one of no org (an import that failed) leads to its import, beside the page's restore. */
function target(n) {
  if (!n.orgId) return n.importId ? importHref(n.importId) : href("notifications");
  if (n.exportId) return href("export", n.orgId, n.exportId);
  if (n.type === "org.deletion_requested" || n.type === "schedule.paused") return href("settings", n.orgId);
  return href("exports", n.orgId);
}

function item(n) {
  const li = el("li", { class: n.readAt ? "read" : "unread", "data-id": n.id });
  const title = el("p", { class: "note-title" });
  if (!n.readAt) title.append(el("span", { class: "tag" }, "Unread"));
  const link = el("a", { href: target(n) }, n.title);
  // Opening a notification marks it read, then goes where it leads.
  link.addEventListener("click", async (event) => {
    // A click that opens another tab or window goes its own way; this one is still marked read.
    const elsewhere = event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey;
    if (!elsewhere) event.preventDefault();
    if (!n.readAt) {
      try {
        await api.readNotification(n.id);
        n.readAt = new Date().toISOString();
        li.className = "read";
        title.querySelector(".tag")?.remove();
      } catch (error) {
        if (unauthenticated(error)) return hooks.signOut(error);
        // Not marked (the org was left since): the link still leads there, which answers for itself.
      }
      refreshCount();
    }
    if (!elsewhere) location.hash = link.getAttribute("href");
  });
  title.append(link);
  const org = state.orgs.find((o) => o.id === n.orgId);
  const meta = el("p", { class: "muted" });
  meta.append(el("time", { datetime: n.at }, words.when(n.at)));
  if (org) meta.append(document.createTextNode(` · ${org.name}`));
  li.append(title, meta);
  return li;
}

async function load(generation, before) {
  const asked = performance.now();
  const { body } = await api.notifications(PAGE, before);
  if (!current(generation)) return;
  const list = $("notification-items");
  if (!before) list.replaceChildren();
  list.append(...body.items.map(item));
  next = body.next;
  $("notifications-older").hidden = !next;
  $("notifications-empty").hidden = list.children.length > 0;
  $("read-all").disabled = body.unread === 0;
  renderCount(body.unread, asked);
}

/** The notifications view: the newest page, read again from the start. */
export async function showNotifications(generation) {
  answer($("notifications-answer"), "");
  next = null;
  try {
    await load(generation, null);
  } catch (error) {
    if (!current(generation)) return;
    if (unauthenticated(error)) return hooks.signOut(error);
    answer($("notifications-answer"), `Your notifications could not be read. ${failure(error)}`, true);
  }
}

async function older() {
  const button = $("notifications-older");
  button.disabled = true;
  try {
    await load(state.generation, next);
  } catch (error) {
    if (unauthenticated(error)) return hooks.signOut(error);
    answer($("notifications-answer"), `Older notifications could not be read. ${failure(error)}`, true);
  } finally {
    button.disabled = false;
  }
}

async function readAll() {
  const button = $("read-all");
  button.disabled = true;
  try {
    await api.readAllNotifications();
    await load(state.generation, null);
    answer($("notifications-answer"), "Every notification is marked as read.");
  } catch (error) {
    if (unauthenticated(error)) return hooks.signOut(error);
    button.disabled = false;
    answer($("notifications-answer"), failure(error), true);
  }
}

// --- email preferences ------------------------------------------------------------------------------------

/** The preferences view: one checkbox per email type, as the API has them now. */
export async function showPreferences(generation) {
  answer($("preferences-answer"), "");
  $("save-preferences").disabled = true;
  let body;
  try {
    ({ body } = await api.preferences());
  } catch (error) {
    if (!current(generation)) return;
    if (unauthenticated(error)) return hooks.signOut(error);
    answer($("preferences-answer"), `Your email preferences could not be read. ${failure(error)}`, true);
    return;
  }
  if (!current(generation)) return;
  // The page's order first; a type the page does not know yet still shows, by its name.
  const known = Object.keys(words.EMAIL_TYPES).filter((t) => t in body.email);
  const types = [...known, ...Object.keys(body.email).filter((t) => !(t in words.EMAIL_TYPES))];
  $("preference-items").replaceChildren(
    ...types.map((type) => {
      const id = `pref-${type.replace(/[^a-z0-9]+/gi, "-")}`;
      const box = el("input", { type: "checkbox", id, "data-type": type });
      box.checked = body.email[type];
      const row = el("div", { class: "choice" });
      row.append(box, el("label", { for: id }, words.EMAIL_TYPES[type] || type));
      return row;
    }),
  );
  $("save-preferences").disabled = false;
}

async function savePreferences(event) {
  event.preventDefault();
  const button = $("save-preferences");
  const slot = $("preferences-answer");
  const email = {};
  for (const box of $("preference-items").querySelectorAll("input[type=checkbox]")) email[box.dataset.type] = box.checked;
  button.disabled = true;
  try {
    const { body } = await api.setPreferences(email);
    const off = Object.keys(body.email).filter((t) => !body.email[t]).length;
    answer(
      slot,
      off ? `Saved. ${off === 1 ? "One kind of email is" : `${off} kinds of email are`} off.` : "Saved. Every kind of email is on.",
    );
  } catch (error) {
    if (unauthenticated(error)) return hooks.signOut(error);
    answer(slot, failure(error), true);
  } finally {
    button.disabled = false;
  }
}
