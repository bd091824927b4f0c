// Talking to the public API: the key (sessionStorage only), fetch with the bearer header,
// Server-Sent Events over fetch (EventSource cannot send a header), and WebSockets that
// carry the key as the `openai-insecure-api-key.<key>` subprotocol the server accepts.

const KEY = "omniqueue.apiKey";

export function getKey() {
  return sessionStorage.getItem(KEY) || "";
}

function setKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

let asking = null;

/** Show the key dialog; resolves with the key in use afterwards ("" if none). */
export function askKey(message = "") {
  if (asking) return asking;
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  document.getElementById("key-message").textContent = message;
  input.value = getKey();
  asking = new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      asking = null;
      if (dialog.returnValue === "save") setKey(input.value.trim());
      if (dialog.returnValue === "forget") setKey("");
      resolve(dialog.returnValue === "save" ? getKey() : "");
    }, { once: true });
  });
  dialog.returnValue = "";
  dialog.showModal();
  input.focus();
  return asking;
}

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message || `HTTP ${status}`);
    this.status = status;
    this.param = body?.error?.param ?? null;
    this.code = body?.error?.code ?? null;
  }
}

/**
 * One API call. `json` sends a JSON body, `form` a FormData; `raw` returns the Response
 * (for streams and files). A 401 asks for a key and tries again with it.
 */
export async function api(path, { method = "GET", json, form, headers = {}, signal, raw } = {}) {
  for (;;) {
    const sent = { ...headers };
    const key = getKey();
    if (key) sent.Authorization = `Bearer ${key}`;
    let body;
    if (json !== undefined) {
      sent["Content-Type"] = "application/json";
      body = JSON.stringify(json);
    } else if (form) {
      body = form;
    }
    const resp = await fetch(path, { method, headers: sent, body, signal });
    if (resp.status === 401) {
      const error = await resp.json().catch(() => null);
      const hint = key ? "That key was refused: " : "This server needs an API key: ";
      if (await askKey(hint + (error?.error?.message || "401"))) continue;
      throw new ApiError(401, error);
    }
    if (!resp.ok) throw new ApiError(resp.status, await resp.json().catch(() => null));
    return raw ? resp : resp.json();
  }
}

/** The served models (`GET /v1/models`), fetched once per page load. */
let modelList = null;
export function models() {
  modelList ??= api("/v1/models").then((r) => r.data).catch((e) => {
    modelList = null;
    throw e;
  });
  return modelList;
}

function parseEvent(block) {
  const event = { id: "", type: "message", data: "" };
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "id") event.id = value;
    else if (field === "event") event.type = value;
    else if (field === "data") event.data += (event.data ? "\n" : "") + value;
  }
  return event.data ? { ...event, data: JSON.parse(event.data) } : null;
}

/**
 * The events of a job (`…/{id}/events`), as `{id, type, data}`, until `done`. A dropped
 * stream is reopened with `Last-Event-ID`, so nothing is missed or seen twice.
 */
export async function* jobEvents(path, signal) {
  let last = "";
  for (let retry = 0; !signal.aborted; retry++) {
    let resp;
    try {
      const headers = { Accept: "text/event-stream" };
      if (last) headers["Last-Event-ID"] = last;
      resp = await api(path, { headers, signal, raw: true });
    } catch (e) {
      if (e instanceof ApiError || signal.aborted) throw e;
      await sleep(Math.min(500 * 2 ** retry, 5000));
      continue;
    }
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replaceAll("\r\n", "\n");
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const event = parseEvent(buffer.slice(0, cut));
          buffer = buffer.slice(cut + 2);
          if (!event) continue;
          if (event.id) last = event.id;
          retry = 0;
          yield event;
          if (event.type === "done") return;
        }
      }
    } catch (e) {
      if (signal.aborted) return;
    }
    await sleep(500);
  }
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** A WebSocket to `path` on this server, with the key as its subprotocol. */
export function openSocket(path) {
  const url = new URL(path, location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const key = getKey();
  const ws = key ? new WebSocket(url, [`openai-insecure-api-key.${key}`]) : new WebSocket(url);
  ws.binaryType = "arraybuffer";
  return ws;
}

/** An element: `el("p", {class: "x", text: "hi"}, child…)`. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  node.append(...children);
  return node;
}

/** Append a line to an event log (newest last, at most 200 lines). */
export function logLine(list, text) {
  const stamp = new Date().toLocaleTimeString([], { hour12: false });
  list.append(el("li", { text: `${stamp}  ${text}` }));
  while (list.children.length > 200) list.firstElementChild.remove();
  list.scrollTop = list.scrollHeight;
}

/** Fill a <select> with the models of one kind (and modality); the chosen id or "". */
export async function fillModels(select, keep) {
  const all = await models();
  const chosen = all.filter(keep);
  select.replaceChildren(...chosen.map((m) => el("option", { value: m.id, text: m.id })));
  return chosen;
}
