// An export's delivery in its row (SPEC §22): where it stands in words ("Delivered to <bucket> at <time>",
// "Delivery failed: ...", "Delivering…"), and, for owners and admins, "Deliver to…" one of the org's destinations
// once the export is complete. The answer is given in the row, beside the button that asked.
import { api, ApiError } from "./api.js";
import * as destinations from "./destinations.js";
import { isOverseer, state } from "./state.js";
import { answer, el, failure } from "./ui.js";
import * as words from "./words.js";

/** The delivery in words; "" when the export was never sent anywhere. */
export function describe(delivery) {
  if (!delivery) return "";
  const d = delivery.destinationId ? destinations.byId(delivery.destinationId) : null;
  const to = d ? ` to ${destinations.name(d)}` : "";
  if (delivery.state === "delivered") return `Delivered${to} at ${words.when(delivery.deliveredAt)}`;
  if (delivery.state === "failed") {
    return `Delivery failed${to}: ${words.DELIVERY_REASONS[delivery.errorCode] || delivery.errorCode || "the bucket did not take it."}`;
  }
  return `Delivering${to}…`;
}

/** The row's delivery parts: a line of state, and the "Deliver to…" control (hidden until it fits). */
export function build(li, headId, onDone) {
  const line = el("p", { class: "delivery", hidden: "" });
  const open = el("button", { type: "button", class: "secondary", "aria-describedby": headId, hidden: "" }, "Deliver to…");
  const form = el("form", { class: "row deliver", hidden: "" });
  const selectId = `${headId}-destination`;
  const select = el("select", { id: selectId });
  const go = el("button", { type: "submit", "aria-describedby": headId }, "Deliver");
  form.append(el("label", { for: selectId }, "Destination"), select, go);
  const slot = el("p", { class: "answer", role: "status" });
  open.addEventListener("click", () => {
    select.replaceChildren(...destinations.items().map((d) => el("option", { value: d.id }, destinations.name(d))));
    if (!select.options.length) {
      answer(slot, "This organization has no destinations yet: add one in its settings.", true);
      return;
    }
    form.hidden = false;
    open.hidden = true;
    select.focus();
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    go.disabled = true;
    try {
      await api.deliver(state.org.id, li.export.id, select.value);
      form.hidden = true;
      answer(slot, `Delivery to ${select.selectedOptions[0].textContent} requested: its state is shown above.`);
    } catch (error) {
      if (error instanceof ApiError && error.code === "unauthenticated") return onDone.signOut(error);
      answer(slot, failure(error), true);
    } finally {
      go.disabled = false;
    }
    await onDone.refresh();
  });
  return { line, open, form, slot };
}

/** Fill the delivery parts for `x`; `completed` is whether the export has a result to deliver. */
export function fill(parts, x, completed) {
  const text = describe(x.delivery);
  parts.line.textContent = text;
  parts.line.hidden = !text;
  parts.line.className = `delivery ${x.delivery ? x.delivery.state : ""}`;
  const offered = completed && isOverseer();
  parts.open.hidden = !offered || !parts.form.hidden;
  if (!offered) parts.form.hidden = true;
}
