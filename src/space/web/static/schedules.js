// The org's schedules (owners and admins, in its settings): list, create, pause or resume, delete, and each one's
// runs; every change is answered beside the form.
import { api, ApiError } from "./api.js";
import * as destinations from "./destinations.js";
import { current, state } from "./state.js";
import { $, answer, confirmAction, el, failure } from "./ui.js";
import * as words from "./words.js";

let signOut = () => {};

export function setup(onSignOut) {
  signOut = onSignOut;
  $("schedule-form").addEventListener("submit", (event) => {
    event.preventDefault();
    create();
  });
  $("schedule-every").addEventListener("change", () => {
    $("schedule-at").disabled = $("schedule-every").value === "hour";
  });
}

const KINDS = { tickets_csv: "Tickets (CSV)", tickets_xlsx: "Tickets (Excel)", snapshot: "Snapshot (JSON)", archive: "Complete archive" };
const PAUSED = { user: "paused", failing: "paused: its runs kept failing", access_revoked: "paused: its creator is no longer an owner or admin", destination_failed: "paused: its destination refused a delivery" };

function describe(s) {
  const when = s.every === "hour" ? "every hour" : s.every === "day" ? `every day at ${s.at} UTC` : `every week (day ${s.weekday}) at ${s.at} UTC`;
  const how = s.incremental ? ", only what changed" : "";
  const d = s.destinationId ? destinations.byId(s.destinationId) : null;
  const to = s.destinationId ? `, delivered to ${d ? destinations.name(d) : "a destination"}` : "";
  const status = s.paused ? PAUSED[s.pausedReason] || "paused" : `next run ${words.when(s.nextRunAt)}`;
  return `${KINDS[s.kind] || s.kind} ${when}${how}${to}: ${status}`;
}

/** The form's "Deliver each run to" choices: nowhere, or one of the org's destinations as last read. */
export function offerDestinations() {
  const select = $("schedule-destination");
  const chosen = select.value;
  select.replaceChildren(
    el("option", { value: "" }, "Nowhere: keep it here to download"),
    ...destinations.items().map((d) => el("option", { value: d.id }, destinations.name(d))),
  );
  select.value = destinations.byId(chosen) ? chosen : "";
}

export async function load(generation) {
  try {
    const { body } = await api.schedules(state.org.id);
    if (generation !== undefined && !current(generation)) return;
    $("schedule-items").replaceChildren(...body.items.map(item));
    $("schedules-empty").hidden = body.items.length > 0;
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") return signOut(error);
    $("schedule-items").replaceChildren(el("li", { class: "muted" }, `The schedules could not be read. ${failure(error)}`));
  }
}

function item(s) {
  const li = el("li", {});
  li.append(el("span", {}, describe(s)));
  const toggle = el("button", { type: "button" }, s.paused ? "Resume" : "Pause");
  toggle.addEventListener("click", () => change(s, { paused: !s.paused }, s.paused ? "The schedule runs again." : "The schedule is paused."));
  const remove = el("button", { type: "button", class: "danger" }, "Delete");
  remove.addEventListener("click", () => del(s, remove));
  const runs = el("button", { type: "button" }, "Show runs");
  const list = el("ul", { class: "plain", hidden: "" });
  runs.addEventListener("click", () => showRuns(s, list, runs));
  li.append(" ", toggle, " ", remove, " ", runs, list);
  return li;
}

async function change(s, body, message) {
  try {
    await api.updateSchedule(state.org.id, s.id, body);
    await load();
    answer($("schedule-answer"), message);
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") return signOut(error);
    answer($("schedule-answer"), failure(error), true);
  }
}

async function del(s, button) {
  const yes = await confirmAction({
    title: "Delete this schedule?",
    text: "No more runs are made. The exports it made stay as they are.",
    yes: "Delete the schedule",
  });
  if (!yes) {
    button.focus();
    return;
  }
  try {
    await api.deleteSchedule(state.org.id, s.id);
    await load();
    answer($("schedule-answer"), "The schedule was deleted.");
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") return signOut(error);
    answer($("schedule-answer"), failure(error), true);
  }
}

async function showRuns(s, list, button) {
  try {
    const { body } = await api.scheduleRuns(state.org.id, s.id);
    list.replaceChildren(
      ...(body.items.length
        ? body.items.map((r) => el("li", {}, `${words.when(r.createdAt)}: ${r.state}${r.errorCode ? ` (${r.errorCode})` : ""}` +
            `${r.rowCount !== null ? `, ${r.rowCount} rows` : ""}${r.since ? `, changes since ${words.when(r.since)}` : ""}`))
        : [el("li", { class: "muted" }, "No runs yet.")]),
    );
    list.hidden = false;
    button.hidden = true;
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") return signOut(error);
    answer($("schedule-answer"), failure(error), true);
  }
}

async function create() {
  const every = $("schedule-every").value;
  const body = { kind: $("schedule-kind").value, every };
  if (every !== "hour") body.at = $("schedule-at").value || "00:00";
  if ($("schedule-incremental").checked) body.incremental = true;
  if ($("schedule-destination").value) body.destinationId = $("schedule-destination").value;
  try {
    const { body: made } = await api.createSchedule(state.org.id, body);
    await load();
    answer($("schedule-answer"), `Schedule created: the first run is ${words.when(made.nextRunAt)}.`);
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") return signOut(error);
    answer($("schedule-answer"), failure(error), true);
  }
}
