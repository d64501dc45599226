// The org's settings: its members, its webhooks, destinations and schedules (owners and admins) and its lifecycle
// (owners), each change asked for where it is made and answered there.
import { api, ApiError } from "./api.js";
import { follow, submit } from "./exports.js";
import { current, isOverseer, state } from "./state.js";
import { $, answer, confirmAction, el, failure } from "./ui.js";
import * as destinations from "./destinations.js";
import * as schedules from "./schedules.js";
import * as words from "./words.js";

let hooks = { signOut: () => {}, orgChanged: () => {} };

export function setup(signOut, orgChanged) {
  hooks = { signOut, orgChanged };
  $("suspend").addEventListener("click", suspend);
  $("reactivate").addEventListener("click", () =>
    lifecycle($("reactivate"), () => api.reactivate(state.org.id), "The organization is active again."),
  );
  $("cancel-deletion").addEventListener("click", () =>
    lifecycle($("cancel-deletion"), () => api.cancelDeletion(state.org.id), "The deletion was cancelled."),
  );
  $("deletion-form").addEventListener("submit", (event) => {
    event.preventDefault();
    requestDeletion(false);
  });
  $("delete-anyway").addEventListener("click", () => requestDeletion(true));
  $("export-everything").addEventListener("click", exportEverything);
  schedules.setup(signOut);
  destinations.setup(signOut, schedules.offerDestinations);
}

export async function show(generation) {
  renderLifecycle();
  renderMembers();
  $("final-export").hidden = true;
  $("final-archive").hidden = true;
  $("final-archive").replaceChildren();
  answer($("lifecycle-answer"), "");
  answer($("deletion-answer"), "");
  $("webhooks").hidden = !isOverseer();
  $("schedules").hidden = !isOverseer();
  $("destinations").hidden = !isOverseer();
  if (isOverseer()) {
    await loadWebhooks(generation);
    await destinations.load(generation);
    await schedules.load(generation);
  }
}

function renderMembers() {
  const items = [...state.members].sort((a, b) => a.name.localeCompare(b.name));
  $("member-items").replaceChildren(
    ...items.map((m) => {
      const you = m.userId === state.me.id ? " (you)" : "";
      return el("li", {}, `${m.name}${you}, ${m.email}: ${words.ROLES[m.role] || m.role}`);
    }),
  );
}

async function loadWebhooks(generation) {
  try {
    const { body } = await api.webhooks(state.org.id);
    if (!current(generation)) return;
    $("webhook-items").replaceChildren(
      ...body.items.map((w) => el("li", {}, `${w.url}: ${w.events.join(", ")} (since ${words.when(w.createdAt)})`)),
    );
    $("webhooks-empty").hidden = body.items.length > 0;
  } catch (error) {
    if (!current(generation)) return;
    if (error instanceof ApiError && error.code === "unauthenticated") return hooks.signOut(error);
    $("webhook-items").replaceChildren(el("li", { class: "muted" }, `The webhooks could not be read. ${failure(error)}`));
  }
}

/** The lifecycle controls that fit the org's state (owners only). */
export function renderLifecycle() {
  const org = state.org;
  $("owner").hidden = state.role !== "owner";
  $("suspend").hidden = org.state !== "active";
  $("reactivate").hidden = org.state !== "suspended";
  $("cancel-deletion").hidden = org.state !== "deleting";
  $("deletion-form").hidden = org.state === "deleting";
  if (org.state === "deleting") $("final-export").hidden = true;
}

async function suspend() {
  const yes = await confirmAction({
    title: `Suspend ${state.org.name}?`,
    text:
      "Every member keeps reading and exporting its data, but nobody can change projects, tasks, tickets or members " +
      "until an owner reactivates it.",
    yes: "Suspend the organization",
  });
  if (!yes) {
    $("suspend").focus();
    return;
  }
  await lifecycle($("suspend"), () => api.suspend(state.org.id), "The organization is suspended: its data can be read and exported, not changed.");
}

async function lifecycle(button, run, message) {
  button.disabled = true;
  try {
    const { body } = await run();
    state.org = body;
    hooks.orgChanged();
    renderLifecycle();
    answer($("lifecycle-answer"), message);
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") return hooks.signOut(error);
    answer($("lifecycle-answer"), failure(error), true);
  } finally {
    button.disabled = false;
  }
}

async function requestDeletion(skipFinalExport) {
  const slot = $("deletion-answer");
  const confirm = $("confirm-name").value;
  if (confirm !== state.org.name) {
    answer(slot, `To confirm, type the organization's name exactly: ${state.org.name}`, true);
    $("confirm-name").focus();
    return;
  }
  if (!skipFinalExport) {
    const yes = await confirmAction({
      title: `Delete ${state.org.name}?`,
      text:
        "New exports and downloads stop at once. After the grace period every project, task, ticket, member and " +
        "export of the organization is purged for good; an owner can cancel the deletion until then.",
      yes: "Delete the organization",
    });
    if (!yes) {
      $("request-deletion").focus();
      return;
    }
  }
  try {
    const { body } = await api.requestDeletion(state.org.id, confirm, skipFinalExport);
    state.org = body;
    $("final-export").hidden = true;
    $("confirm-name").value = "";
    hooks.orgChanged();
    renderLifecycle();
    const when = body.deleteAfter ? ` on ${words.when(body.deleteAfter)}` : "";
    answer($("lifecycle-answer"), `Deletion requested: the organization is purged${when}. You can cancel it until then.`);
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") return hooks.signOut(error);
    if (error instanceof ApiError && error.code === "final_export_recommended") {
      $("final-export").hidden = false;
      answer(slot, words.problem(error), true);
      $("export-everything").focus();
      return;
    }
    answer(slot, failure(error), true);
  }
}

async function exportEverything() {
  const created = await submit({ kind: "archive" }, $("export-everything"), $("deletion-answer"));
  if (!created) return;
  $("final-export").hidden = true;
  answer(
    $("deletion-answer"),
    "An archive of everything is being built, shown here. When it is ready, download it, then request the deletion again.",
  );
  await follow($("final-archive"), created.id, state.generation);
}
