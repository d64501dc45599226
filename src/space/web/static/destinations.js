// The org's destinations (owners and admins, in its settings): the buckets its exports are delivered into. Listed,
// added (the secret is sent once and never shown or filled back) and removed after a confirmation; each change is
// answered beside the control that asked. The list is kept here for the views that name a destination's bucket.
import { api, ApiError } from "./api.js";
import { current, isOverseer, state } from "./state.js";
import { $, answer, confirmAction, el, failure } from "./ui.js";
import * as words from "./words.js";

let signOut = () => {};
let onChange = () => {};
const known = { orgId: null, items: [] };

export function setup(onSignOut, changed) {
  signOut = onSignOut;
  onChange = changed;
  $("destination-form").addEventListener("submit", (event) => {
    event.preventDefault();
    create();
  });
}

/** The org's destinations as last read (owners and admins only; others see none). */
export function items() {
  return state.org && known.orgId === state.org.id ? known.items : [];
}

/** "bucket/prefix", how a destination is named in a sentence. */
export function name(d) {
  return d.prefix ? `${d.bucket}/${d.prefix}` : d.bucket;
}

export function byId(id) {
  return items().find((d) => d.id === id) || null;
}

/** Read the org's destinations once per org (for the export views); a failure leaves the names out, nothing more. */
export async function ensure() {
  if (!isOverseer() || known.orgId === state.org.id) return;
  try {
    const { body } = await api.destinations(state.org.id);
    Object.assign(known, { orgId: state.org.id, items: body.items });
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") signOut(error);
  }
}

function describe(d) {
  const where = d.endpointUrl ? ` at ${d.endpointUrl}` : d.region ? ` in ${d.region}` : "";
  const last = d.lastError
    ? `; its last delivery failed: ${d.lastError}`
    : d.lastDeliveryAt
      ? `; last delivered ${words.when(d.lastDeliveryAt)}`
      : "; nothing delivered yet";
  return `S3 bucket ${name(d)}${where}${last}`;
}

export async function load(generation) {
  try {
    const { body } = await api.destinations(state.org.id);
    if (generation !== undefined && !current(generation)) return;
    Object.assign(known, { orgId: state.org.id, items: body.items });
    $("destination-items").replaceChildren(...body.items.map(item));
    $("destinations-empty").hidden = body.items.length > 0;
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") return signOut(error);
    $("destination-items").replaceChildren(el("li", { class: "muted" }, `The destinations could not be read. ${failure(error)}`));
  }
  onChange();
}

function item(d) {
  const li = el("li", {});
  const remove = el("button", { type: "button", class: "danger", "aria-label": `Remove ${name(d)}` }, "Remove");
  const slot = el("p", { class: "answer", role: "status" });
  remove.addEventListener("click", () => del(d, remove, slot));
  li.append(el("span", {}, describe(d)), " ", remove, slot);
  return li;
}

async function del(d, button, slot) {
  const yes = await confirmAction({
    title: `Remove the destination ${name(d)}?`,
    text: "Nothing more is delivered there. What was delivered stays in the bucket.",
    yes: "Remove the destination",
  });
  if (!yes) {
    button.focus();
    return;
  }
  try {
    await api.deleteDestination(state.org.id, d.id);
    await load();
    answer($("destination-answer"), `The destination ${name(d)} was removed.`);
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") return signOut(error);
    answer(slot, failure(error), true);
  }
}

async function create() {
  const body = { type: "s3", bucket: $("destination-bucket").value.trim(), prefix: $("destination-prefix").value.trim() };
  for (const [field, id] of [["region", "destination-region"], ["endpointUrl", "destination-endpoint"]]) {
    const value = $(id).value.trim();
    if (value) body[field] = value;
  }
  body.accessKeyId = $("destination-key").value.trim();
  body.secretAccessKey = $("destination-secret").value;
  const button = $("add-destination");
  button.disabled = true;
  try {
    const { body: made } = await api.createDestination(state.org.id, body);
    $("destination-form").reset();
    await load();
    answer($("destination-answer"), `The destination ${name(made)} was added: a test file was written to it.`);
  } catch (error) {
    if (error instanceof ApiError && error.code === "unauthenticated") return signOut(error);
    answer($("destination-answer"), failure(error), true);
  } finally {
    button.disabled = false;
  }
}
