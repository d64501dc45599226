// What the API's states and codes mean, in plain words, and how times and sizes read.

export const KINDS = {
  snapshot: "Snapshot (JSON)",
  archive: "Complete archive (ZIP)",
  tickets_csv: "Tickets (CSV)",
  tickets_xlsx: "Tickets (Excel workbook)",
};

export const STATES = {
  queued: "Waiting to start",
  running: "Building",
  completed: "Ready to download",
  failed: "Failed",
  cancelled: "Cancelled",
  expired: "Expired",
  revoked: "Removed by an administrator",
};

// Why an export ended without a result (its errorCode), told to the export's creator. `cancelled` and the row
// limits depend on who reads and on the kind: see reason().
const EXPORT_REASONS = {
  cancelled: "You cancelled this export.",
  cancelled_by_admin: "An owner or administrator of the organization cancelled this export.",
  access_revoked: "Your role in the organization changed, so this export was stopped: you may no longer take this data.",
  org_deleting: "The organization is being deleted, so this export was stopped.",
  too_many_rows: "Too many rows for one export. Narrow the filters and request it again.",
  too_large: "The file would be too large. Narrow the filters and request it again.",
  quota_exceeded: "The organization's storage for exports is full. Delete older exports, then request it again.",
  worker_lost: "The export was interrupted several times and could not finish. Request it again.",
  timeout: "Reading the data took too long. Request it again, perhaps with narrower filters.",
  export_revoked: "An owner or administrator of the organization removed this export's file. Request a new one if you still need it.",
};

// Why a restore failed (an import's errorCode), said to the importer in the page and in the email of
// `import.failed` (never the import's errorDetail in an email: it may quote the archive).
const IMPORT_REASONS = {
  archive_invalid: "The file is not a complete Space archive as it was made: a member is missing, extra or changed, or a line is not valid. Nothing of it was kept.",
  ids_in_use: "The archive's projects and tasks are still here (is the original organization still here?). Restore it with new ids.",
  org_limit_reached: "You have created as many organizations as one person may.",
  too_large: "The archive is larger than this Space accepts for a restore.",
  restore_failed: "The restore stopped on an unexpected error; nothing of it was kept. Try again.",
};

/** Why a restore failed, in words. */
export function importReason(errorCode) {
  return IMPORT_REASONS[errorCode] || `The restore stopped (${errorCode}); nothing of it was kept.`;
}

// What an answer of the API means for the person who asked.
const PROBLEMS = {
  unauthenticated: "That token was not accepted: it is unknown, revoked or mistyped.",
  forbidden: "Your role in this organization does not allow this.",
  access_revoked: "Your access to this export was withdrawn: your role changed or you left the organization.",
  not_found: "It no longer exists, or it is not yours.",
  org_deleting: "The organization is being deleted: no new exports or downloads.",
  org_suspended: "The organization is suspended: its data can be read and exported, not changed.",
  final_export_recommended: "Take a complete export before deleting the organization.",
  invalid_transition: "The organization is not in a state that allows this.",
  export_not_ready: "The export is not finished yet.",
  export_failed: "The export failed, so there is nothing to download.",
  export_expired: "The export expired: its file can no longer be downloaded. Request a new one.",
  export_revoked: "An owner or administrator removed this export's file.",
  export_quota_exceeded: "The organization's storage for exports is full. Delete older exports first.",
  link_expired: "The download link expired. Press Download again for a new one.",
  link_invalid: "The download link is not valid. Press Download again for a new one.",
  org_limit_reached: "You have created as many organizations as one person may.",
  last_owner: "An organization needs at least one owner.",
  busy: "The server is busy with other downloads.",
  timeout: "The server took too long to answer.",
  invalid_request: "The request was not accepted",
  already_member: "That person is already a member of this organization.",
  webhook_limit_reached: "The organization has as many webhook endpoints as allowed. Remove one before adding another.",
  destination_unreachable: "The destination was not saved: a test file could not be written to it.",
  destination_in_use: "A schedule delivers to this destination. Change or delete that schedule first, then remove it.",
  schedule_limit_reached: "The organization has as many schedules as allowed. Delete one before adding another.",
  rate_limited: "You have asked for many download links just now.",
  unavailable: "The service cannot reach its database just now.",
  too_large: "The archive is larger than this Space accepts for a restore.",
  ids_in_use: "The archive's projects and tasks are still here (is the original organization still here?). Restore it with new ids.",
  range_not_satisfiable: "That part of the file does not exist.",
  payload_too_large: "The request is too large.",
  internal_error: "Something went wrong on the server.",
};

// An archive and a snapshot have no filters to narrow: each says which limit it met and who can raise it.
const LIMIT_REASONS = {
  too_many_rows: {
    archive:
      "One of the archive's files has more rows than an archive may hold. The operator can raise SPACE_ARCHIVE_ROW_LIMIT, then request it again; a snapshot also counts as the final export before a deletion.",
    snapshot:
      "The organization has more projects and tasks than one snapshot may hold. The operator can raise SPACE_EXPORT_ROW_LIMIT; the complete archive has limits of its own.",
  },
  too_large: {
    archive:
      "The archive would be larger than an archive may be. The operator can raise SPACE_ARCHIVE_BYTE_LIMIT, then request it again.",
    snapshot:
      "The snapshot would be larger than one export may be. The operator can raise SPACE_EXPORT_BYTE_LIMIT; the complete archive has limits of its own.",
  },
  timeout: {
    archive: "Reading the data took too long. The operator can raise SPACE_ARCHIVE_TIMEOUT_SECONDS; request it again.",
    snapshot: "Reading the data took too long. Request it again.",
  },
};

/**
 * Why an export ended, in words for the person reading: `kind` chooses words that fit the export (an archive has
 * no filters), `viewer` is who reads (null: its creator) so that a cancellation reads "You cancelled" only to the
 * one who did.
 */
export function reason(errorCode, kind = "tickets_csv", viewer = null) {
  if (!errorCode) return "";
  if (errorCode === "cancelled" && viewer && !viewer.isCreator) return `${viewer.creatorName} cancelled this export.`;
  if (errorCode === "cancelled_by_admin" && viewer && !viewer.isCreator) {
    return "An owner or administrator of the organization cancelled this export.";
  }
  if (errorCode === "access_revoked" && viewer && !viewer.isCreator) {
    return `${viewer.creatorName}'s role changed, so this export was stopped.`;
  }
  const byKind = LIMIT_REASONS[errorCode];
  if (byKind && byKind[kind]) return byKind[kind];
  return EXPORT_REASONS[errorCode] || `The export stopped (${errorCode}).`;
}

/** A refusal of the API in plain words; when to retry if it said so. */
export function problem(error) {
  if (!error || !error.code) return "Something went wrong. Try again.";
  let text = PROBLEMS[error.code];
  if (error.code === "export_rate_limited") {
    const seconds = Math.ceil(error.retryAfter ?? 60);
    text = `You have asked for several exports just now. You can ask again in ${duration(seconds)} (at ${clock(Date.now() + seconds * 1000)}).`;
  } else if (error.code === "export_failed" && error.body && error.body.errorCode) {
    text = `${PROBLEMS.export_failed} ${reason(error.body.errorCode, error.body.kind)}`;
  } else if (error.code === "destination_unreachable" && error.body && error.body.detail) {
    text = `The destination was not saved. ${error.body.detail}`;
  } else if (error.code === "invalid_request") {
    text = `${PROBLEMS.invalid_request}: ${error.message}`;
  } else if (!text) {
    text = error.message || `The request failed (${error.code}).`;
  } else if (error.retryAfter) {
    text = `${text} Try again in ${duration(Math.ceil(error.retryAfter))}.`;
  }
  return text;
}

export function when(iso) {
  const date = new Date(iso);
  return date.toLocaleString(undefined, {
    year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
    timeZoneName: "short",
  });
}

/** The viewer's time of day with its zone named ("14:05:09 UTC"): a time alone says nothing to another zone. */
export function clock(ms) {
  return new Date(ms).toLocaleTimeString(undefined, {
    hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short",
  });
}

/**
 * "2 h 5 min", "45 s", "7 days": to the nearest unit, never rounded down past a whole one ("in 7 days" stays
 * until it is nearer to 6 days).
 */
export function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  const m = Math.round(s / 60);
  if (m < 60) return `${m} min`;
  const h = Math.floor(m / 60);
  if (m < 48 * 60) return m % 60 ? `${h} h ${m % 60} min` : `${h} h`;
  const days = Math.round(s / 86400);
  return `${days} days`;
}

export function size(bytes) {
  if (bytes === null || bytes === undefined) return "";
  const units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${bytes} bytes` : `${value.toFixed(1)} ${units[unit]}`;
}

export function count(n) {
  return n === 1 ? "1 row" : `${n.toLocaleString()} rows`;
}

const FILTER_WORDS = { status: "status", priority: "priority", assignment: "assignment", q: "text" };

export function filters(f) {
  // A fixed order, whatever order the stored JSON comes back in.
  const given = f || {};
  const keys = [...Object.keys(FILTER_WORDS), ...Object.keys(given).filter((k) => !(k in FILTER_WORDS))];
  const parts = keys
    .filter((k) => given[k] !== undefined && given[k] !== null)
    .map((k) => `${FILTER_WORDS[k] || k} ${k === "q" ? `"${given[k]}"` : given[k]}`);
  return parts.length ? parts.join(", ") : "all tickets";
}

export const ROLES = { owner: "Owner", admin: "Administrator", member: "Member", customer: "Customer" };

/** "an owner", "a customer": a role inside a sentence. */
export const ROLE_IN_SENTENCE = { owner: "an owner", admin: "an administrator", member: "a member", customer: "a customer" };

export const DELIMITERS = { ",": "commas (,)", ";": "semicolons (;)" };

/** What separates the CSV's columns, for the kinds that write one. */
export function delimiter(x) {
  if (x.kind === "tickets_csv") return `Columns separated by ${DELIMITERS[x.delimiter] || x.delimiter}`;
  if (x.kind === "archive") return `tickets.csv columns separated by ${DELIMITERS[x.delimiter || ","]}`;
  return "";
}

// --- deliveries (SPEC §22) ---

/** Why a delivery failed (the export's `delivery.errorCode`), after "Delivery failed: ". */
export const DELIVERY_REASONS = {
  destination_failed: "the bucket refused the files, or did not answer. Check its credentials and policy, then deliver again.",
  export_expired: "the export's file was gone before it could be copied. Request a new export.",
  destination_removed: "the destination was removed before the files were copied.",
};

// --- notifications (SPEC §19) ---

/** Each email type in words, for the preferences form ("Email me when ..."). */
export const EMAIL_TYPES = {
  "export.completed": "An export of mine is ready",
  "export.failed": "An export of mine failed",
  "export.cancelled": "An export of mine was cancelled by someone else",
  "org.deletion_requested": "An organization I own is to be deleted",
  "schedule.paused": "A schedule I made, or one in an organization I own, was paused",
  "import.completed": "An archive I uploaded was restored",
  "import.failed": "An archive I uploaded could not be restored",
};

/** The notifications control's name for screen readers: the count is in it, the badge is only seen. */
export function notificationsLabel(unread) {
  return unread ? `Notifications, ${unread} unread` : "Notifications";
}
