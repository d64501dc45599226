// "Restore an archive" (SPEC §23): the ZIP uploaded with a progress bar (XMLHttpRequest: fetch reports no upload
// progress), then the import followed until it ends, and its report told in words beside the form.
import { ApiError, call, token } from "./api.js";
import { current } from "./state.js";
import { $, answer, failure } from "./ui.js";
import * as words from "./words.js";

const POLL_MS = 1000;

const some = (n, one) => `${n} ${one}${n === 1 ? "" : "s"}`;

function upload(file, query, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", `/imports?${query}`);
    xhr.setRequestHeader("Content-Type", "application/zip");
    xhr.setRequestHeader("Accept", "application/json");
    xhr.setRequestHeader("Authorization", `Bearer ${token()}`);
    xhr.upload.addEventListener("progress", (e) => e.lengthComputable && onProgress(e.loaded / e.total));
    xhr.addEventListener("load", () => {
      let body = {};
      try {
        body = JSON.parse(xhr.responseText || "{}");
      } catch {
        body = { detail: xhr.responseText };
      }
      if (xhr.status === 202) resolve(body);
      else reject(new ApiError(xhr.status, body, null));
    });
    xhr.addEventListener("error", () => reject(new Error("unreachable")));
    xhr.send(file);
  });
}

const PHASES = { checking: "Checking the archive", restoring: "Writing its rows", verifying: "Comparing with the archive" };

/** The finished import in words. */
export function report(imp) {
  if (imp.state === "failed") {
    return `The restore failed and nothing was kept: ${imp.errorDetail || words.importReason(imp.errorCode)}`;
  }
  const r = imp.report || {};
  const c = r.counts || {};
  const counts = ["member", "project", "task", "ticket"].map((k) => some(c[`${k}s`] ?? 0, k)).join(", ");
  const members = r.members || { matched: [], placeholders: [] };
  const people =
    `${some(members.matched.length, "member")} matched people here` +
    (members.placeholders.length
      ? `; ${members.placeholders.length} have no account yet (${members.placeholders.join(", ")}) and join when one is made for them.`
      : ".");
  if (imp.dryRun) {
    const ids = r.idsInUse ? ` ${r.idsInUse} of its ids are in use here: restore it with new ids.` : "";
    return `The archive is valid: ${counts}. ${people}${ids} Nothing was written.`;
  }
  const mapped = Object.values(r.idMap || {}).reduce((n, m) => n + Object.keys(m).length, 0);
  const verified = r.verified
    ? "It was read back and matches the archive exactly."
    : "It was read back but does not match the archive exactly (see the report's files).";
  return `${imp.name} was restored: ${counts}. ${people}${mapped ? ` ${some(mapped, "id")} given new ones.` : ""} ${verified}`;
}

async function follow(id, bar, slot, done, still = () => true) {
  for (;;) {
    const { body } = await call("GET", `/imports/${encodeURIComponent(id)}`);
    if (!still()) return; // the page went elsewhere meanwhile: this answer is no longer shown
    bar.value = body.progress;
    if (body.state === "completed" || body.state === "failed") return done(body);
    slot.textContent = `${PHASES[body.phase] || "Waiting for a worker"}… ${body.progress}%`;
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}

let hooks = { expired: () => {} };

/** One of the caller's imports, by its address (`#/imports/<id>`, where its notification and email lead): its
 * report beside the form, followed to its end while it runs. */
export async function show(id, generation) {
  const slot = $("restore-answer");
  const bar = $("restore-progress");
  answer(slot, "Reading the import…");
  try {
    const { body } = await call("GET", `/imports/${encodeURIComponent(id)}`);
    if (!current(generation)) return;
    const ended = (imp) => answer(slot, report(imp), imp.state === "failed");
    if (body.state === "completed" || body.state === "failed") return ended(body);
    bar.hidden = false;
    await follow(id, bar, slot, ended, () => current(generation));
  } catch (error) {
    if (!current(generation)) return;
    if (error instanceof ApiError && error.code === "unauthenticated") return hooks.expired(error);
    answer(slot, error instanceof ApiError && error.status === 404 ? "This import does not exist, or it is not yours." : failure(error), true);
  } finally {
    bar.hidden = true;
  }
}

export function setup(expired, restored) {
  hooks = { expired };
  $("restore-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const file = $("restore-file").files[0];
    const name = $("restore-name").value.trim();
    const slot = $("restore-answer");
    const bar = $("restore-progress");
    if (!file || !name) return answer(slot, "Choose the archive and name the organization.", true);
    const query = new URLSearchParams({ name });
    if ($("restore-new-ids").checked) query.set("newIds", "true");
    if ($("restore-dry-run").checked) query.set("dryRun", "true");
    $("restore-start").disabled = true;
    bar.hidden = false;
    bar.value = 0;
    try {
      answer(slot, "Uploading the archive…");
      const created = await upload(file, query, (share) => (bar.value = Math.round(share * 100)));
      answer(slot, "Uploaded. Waiting for a worker…");
      await follow(created.id, bar, slot, async (imp) => {
        answer(slot, report(imp), imp.state === "failed");
        if (imp.state === "completed" && imp.orgId) await restored(imp.orgId);
      });
    } catch (error) {
      if (error instanceof ApiError && error.code === "unauthenticated") return expired(error);
      answer(slot, failure(error), true);
    } finally {
      $("restore-start").disabled = false;
      bar.hidden = true;
    }
  });
}
