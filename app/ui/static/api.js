// Calls to the service's JSON APIs with the key this tab holds (sessionStorage, bearer header only).
const KEY = "ttc.key";

export const getKey = () => sessionStorage.getItem(KEY);
export const setKey = (key) => sessionStorage.setItem(KEY, key);
export const forgetKey = () => sessionStorage.removeItem(KEY);

/** An error envelope from the service: message, param (the offending field), code, HTTP status. */
export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.param = e.param || null;
    this.code = e.code || null;
  }
}

function headers(json) {
  const h = { Accept: "application/json" };
  const key = getKey();
  if (key) h.Authorization = `Bearer ${key}`;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

function request(path, method, body, signal) {
  return fetch(path, {
    method, headers: headers(body !== undefined), signal, credentials: "omit", cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}

async function parsed(resp) {
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { error: { message: text } }; }
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}

/** JSON in, JSON out; a non-2xx answer throws ApiError. */
export async function api(path, { method = "GET", body, signal } = {}) {
  return parsed(await request(path, method, body, signal));
}

/** POST a streaming request and yield each server-sent event's parsed data (not "[DONE]"). */
export async function* sse(path, body, signal) {
  const resp = await request(path, "POST", body, signal);
  if (!resp.ok) await parsed(resp);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (data && data !== "[DONE]") yield JSON.parse(data);
    }
  }
}
