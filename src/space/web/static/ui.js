// Small pieces every view uses: elements, answers beside the control that asked, confirmation dialogs.
import { ApiError } from "./api.js";
import * as words from "./words.js";

export const $ = (id) => document.getElementById(id);

export function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  if (text !== undefined) node.textContent = text;
  return node;
}

/**
 * Answer an action where it was taken: `slot` is the answer element beside the control. It is a live region
 * (status, or alert for a failure) so a screen reader announces it, and it is scrolled into view so that nobody
 * has to look for it on a long page or a phone.
 */
export function answer(slot, text, bad = false) {
  slot.setAttribute("role", bad ? "alert" : "status");
  slot.classList.toggle("bad", bad);
  slot.textContent = text;
  // Centred rather than "nearest": at the very edge of a phone's screen an answer is easy to miss.
  if (text) slot.scrollIntoView({ block: "center" });
}

/** A failure in words: an API refusal as the API explained it, or an unreachable server. */
export function failure(error) {
  if (error instanceof ApiError) return words.problem(error);
  return "The server could not be reached. Try again.";
}

/**
 * Ask before an action that can't be taken back lightly: a modal dialog, answered by its two buttons or Escape
 * (which means no). Resolves to true only for the explicit yes.
 */
export function confirmAction({ title, text, yes }) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-yes").textContent = yes;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    dialog.showModal();
    $("confirm-no").focus();
  });
}
