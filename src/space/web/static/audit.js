// The audit trail (owners and admins) as sentences with names and times; ids and raw details on demand.
import { api, ApiError } from "./api.js";
import { current, state } from "./state.js";
import { $, answer, el, failure } from "./ui.js";
import * as words from "./words.js";

let next = null;
let hooks = { signOut: () => {} };

export function setup(signOut) {
  hooks = { signOut };
  $("audit-more").addEventListener("click", () => load(state.generation, false));
}

export async function show(generation) {
  await load(generation, true);
}

async function load(generation, first) {
  const list = $("audit-items");
  try {
    const { body } = await api.audit(state.org.id, first ? null : next);
    if (!current(generation)) return;
    if (first) list.replaceChildren();
    list.append(...body.items.map(entry));
    next = body.next;
    $("audit-more").hidden = !body.next;
    answer($("audit-answer"), "");
  } catch (error) {
    if (!current(generation)) return;
    if (error instanceof ApiError && error.code === "unauthenticated") return hooks.signOut(error);
    answer($("audit-answer"), `The audit trail could not be read. ${failure(error)}`, true);
  }
}

function entry(item) {
  const li = el("li");
  const line = el("p", { class: "sentence" });
  line.append(el("time", { datetime: item.at }, words.when(item.at)), " ", sentence(item));
  const details = el("details", { class: "ids" });
  const facts = [
    ["Action", item.action],
    [`Target (${item.target.type})`, item.target.id],
  ];
  if (item.actor) facts.push(["Actor (user id)", item.actor.userId]);
  if (item.ip) facts.push(["From address", item.ip]);
  for (const [key, value] of Object.entries(item.details || {})) {
    if (value !== null && value !== undefined) facts.push([key, typeof value === "string" ? value : JSON.stringify(value)]);
  }
  const dl = el("dl");
  dl.append(...facts.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]));
  details.append(el("summary", {}, "Details"), dl);
  li.append(line, details);
  return li;
}

function actorName(item) {
  if (!item.actor) return "Space";
  return item.actor.userId === state.me.id ? "You" : item.actor.name || "A former member";
}

function userName(item) {
  if (item.target.id === state.me.id) return "you";
  return item.target.name || "a former member";
}

function kindName(item) {
  const kind = item.target.kind || (item.details && item.details.kind);
  return words.KINDS[kind] || "an export";
}

/** "Ana Member downloaded Tickets (CSV) through a link, 2.4 KiB." */
export function sentence(item) {
  const who = actorName(item);
  const d = item.details || {};
  const kind = kindName(item);
  const role = (r) => words.ROLE_IN_SENTENCE[r] || r;
  switch (item.action) {
    case "export.requested":
      return `${who} requested an export: ${kind}.`;
    case "export.completed":
      return `${kind} was ready${d.rows !== undefined && d.rows !== null ? `: ${words.count(d.rows)}, ${words.size(d.bytes)}` : ""}.`;
    case "export.failed":
      return `${kind} failed. ${words.reason(d.errorCode, item.target.kind || d.kind, { isCreator: false, creatorName: "Its requester" })}`;
    case "export.cancelled":
      return item.actor ? `${who} cancelled ${kind}.` : `${kind} was stopped. ${words.reason(d.errorCode, item.target.kind, { isCreator: false, creatorName: "Its requester" })}`;
    case "export.deleted":
      return d.revoked ? `${who} removed the file of ${kind}.` : `${who} deleted ${kind}.`;
    case "export.link_created":
      return `${who} made a download link for ${kind}${d.expiresAt ? `, valid until ${words.clock(Date.parse(d.expiresAt))}` : ""}.`;
    case "export.downloaded": {
      const via = d.via === "link" ? "through a link" : "with an API token";
      const part = d.range ? ` (part: ${d.range})` : "";
      const amount = d.bytes !== null && d.bytes !== undefined ? `, ${words.size(d.bytes)}` : "";
      const store = d.redirect ? ", from the object store" : "";
      return `${who} downloaded ${kind} ${via}${part}${amount}${store}.`;
    }
    case "member.added":
      return `${who} added ${userName(item)} as ${role(d.role)}.`;
    case "member.role_changed":
      return `${who} made ${userName(item)} ${role(d.to)} (was ${role(d.from)}).`;
    case "member.removed":
      return `${who} removed ${userName(item)} (${role(d.role)}) from the organization.`;
    case "org.suspended":
      return `${who} suspended the organization.`;
    case "org.reactivated":
      return `${who} reactivated the organization.`;
    case "org.deletion_requested":
      return `${who} requested the organization's deletion${d.skipFinalExport ? ", without a final export" : ""}.`;
    case "org.deletion_cancelled":
      return `${who} cancelled the organization's deletion.`;
    default:
      return `${who}: ${item.action}.`;
  }
}
