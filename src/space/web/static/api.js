// A client of Space's public API. The token lives in sessionStorage only: never a cookie, a URL or localStorage.
const TOKEN_KEY = "space.token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function signIn(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** An error answer of the API (RFC 9457 problem+json), with its machine code and Retry-After in seconds. */
export class ApiError extends Error {
  constructor(status, body, retryAfter) {
    super(body.detail || body.title || `HTTP ${status}`);
    this.status = status;
    this.code = body.code || "error";
    this.body = body;
    this.retryAfter = retryAfter;
  }
}

function retryAfterSeconds(response) {
  const value = response.headers.get("Retry-After");
  if (value === null) return null;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds);
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, (at - Date.now()) / 1000);
}

/** Call the API as the signed-in user: resolves to {body, status, retryAfter}, or throws ApiError. */
export async function call(method, path, body) {
  const headers = { Accept: "application/json" };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  const init = { method, headers, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const retryAfter = retryAfterSeconds(response);
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { detail: text };
    }
  }
  if (!response.ok) throw new ApiError(response.status, data || {}, retryAfter);
  return { body: data, status: response.status, retryAfter };
}

function page(limit, before) {
  return `limit=${limit}${before ? `&before=${encodeURIComponent(before)}` : ""}`;
}

export const api = {
  me: () => call("GET", "/me"),
  orgs: () => call("GET", "/orgs"),
  createOrg: (name) => call("POST", "/orgs", { name }),
  org: (orgId) => call("GET", `/orgs/${orgId}`),
  members: (orgId) => call("GET", `/orgs/${orgId}/members`),
  webhooks: (orgId) => call("GET", `/orgs/${orgId}/webhooks`),
  destinations: (orgId) => call("GET", `/orgs/${orgId}/destinations`),
  createDestination: (orgId, body) => call("POST", `/orgs/${orgId}/destinations`, body),
  deleteDestination: (orgId, id) => call("DELETE", `/orgs/${orgId}/destinations/${id}`),
  deliver: (orgId, exportId, destinationId) =>
    call("POST", `/orgs/${orgId}/exports/${exportId}/deliveries`, { destinationId }),
  schedules: (orgId) => call("GET", `/orgs/${orgId}/schedules`),
  createSchedule: (orgId, body) => call("POST", `/orgs/${orgId}/schedules`, body),
  updateSchedule: (orgId, id, body) => call("PATCH", `/orgs/${orgId}/schedules/${id}`, body),
  deleteSchedule: (orgId, id) => call("DELETE", `/orgs/${orgId}/schedules/${id}`),
  scheduleRuns: (orgId, id) => call("GET", `/orgs/${orgId}/schedules/${id}/runs`),
  exports: (orgId, limit, before) => call("GET", `/orgs/${orgId}/exports?${page(limit, before)}`),
  orgExports: (orgId, limit, before) => call("GET", `/orgs/${orgId}/exports?scope=org&${page(limit, before)}`),
  export: (orgId, exportId) => call("GET", `/orgs/${orgId}/exports/${encodeURIComponent(exportId)}`),
  createExport: (orgId, request) => call("POST", `/orgs/${orgId}/exports`, request),
  deleteExport: (orgId, exportId) => call("DELETE", `/orgs/${orgId}/exports/${exportId}`),
  link: (orgId, exportId) => call("POST", `/orgs/${orgId}/exports/${exportId}/links`),
  audit: (orgId, before) =>
    call("GET", `/orgs/${orgId}/audit?limit=50${before ? `&before=${encodeURIComponent(before)}` : ""}`),
  suspend: (orgId) => call("POST", `/orgs/${orgId}/suspend`),
  reactivate: (orgId) => call("POST", `/orgs/${orgId}/reactivate`),
  requestDeletion: (orgId, confirm, skipFinalExport) =>
    call("POST", `/orgs/${orgId}/deletion`, skipFinalExport ? { confirm, skipFinalExport: true } : { confirm }),
  cancelDeletion: (orgId) => call("DELETE", `/orgs/${orgId}/deletion`),
  notifications: (limit, before) => call("GET", `/me/notifications?${page(limit, before)}`),
  readNotification: (id) => call("POST", `/me/notifications/${encodeURIComponent(id)}/read`),
  readAllNotifications: () => call("POST", "/me/notifications/read"),
  preferences: () => call("GET", "/me/preferences"),
  setPreferences: (email) => call("PUT", "/me/preferences", { email }),
};
