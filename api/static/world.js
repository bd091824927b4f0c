// World: `WS /v1/realtime/video`. The fMP4 fragments (the first one carries the init
// segment) are appended to a Media Source Extensions buffer as they arrive, so the video
// plays while it is generated; w/a/s/d (keys or buttons) go up as camera interactions,
// and "Send prompt" as a prompt change the model blends in from its next chunk.
// A session runs until Stop, asking for the longest rollout the model's limits on
// `/v1/models` allow (`max_frames`); when the server ends it at that limit (or at its
// session time limit) the page says so. The server paces generation a few chunks ahead
// of playback, so a key shows within about two seconds; a key no chunk is left for is
// answered `interaction_too_late`, and one pressed after the session ended says why.
import { el, fillModels, logLine, openSocket } from "./api.js";

const SIZES = [[256, 144], [320, 176], [480, 272], [640, 352], [832, 480], [1280, 720]];
const $ = (id) => document.getElementById(id);
const log = (text) => logLine($("world-log"), text);
let served = new Map();
let session = null;

export async function init() {
  const list = await fillModels($("world-model"), (m) => m.kind === "world");
  served = new Map(list.map((m) => [m.id, m]));
  if (!list.length) $("world-status").textContent = "no realtime video model is served";
  else applyModel(list[0]);
  $("world-model").addEventListener("change", () => applyModel(served.get($("world-model").value)));
  $("world-form").addEventListener("submit", (event) => {
    event.preventDefault();
    start().catch((e) => status(`could not start: ${e.message}`));
  });
  $("world-stop").addEventListener("click", () => session?.send({ type: "session.stop" }));
  for (const button of document.querySelectorAll(".wasd button")) {
    button.addEventListener("click", () => interact(button.dataset.key));
  }
  $("world-steer").addEventListener("submit", (event) => {
    event.preventDefault();
    const prompt = $("world-steer-prompt").value.trim();
    if (prompt) interact(`prompt "${prompt}"`, { prompt }); // blended in by the model
  });
  document.addEventListener("keydown", (event) => {
    const typing = event.target.closest?.("input, textarea, select");
    const key = event.key.toLowerCase();
    if (document.body.dataset.page !== "world" || typing || !"wasd".includes(key)) return;
    if (key.length !== 1 || event.repeat || event.ctrlKey || event.metaKey || event.altKey) return;
    event.preventDefault();
    interact(key);
  });
}

function applyModel(model) {
  const lim = model.limits;
  const fits = ([w, h]) => w <= lim.max_width && h <= lim.max_height &&
    w % lim.size_multiple === 0 && h % lim.size_multiple === 0;
  const sizes = [...new Set([lim.default_size, ...SIZES.filter(fits).map(([w, h]) => `${w}x${h}`)])];
  const select = $("world-size");
  select.replaceChildren(...sizes.map((s) => el("option", { value: s, text: s })));
  select.value = lim.default_size;
  const most = longest(lim);
  $("world-limit").textContent = most
    ? `Runs until Stop, at most ${most.text} a session: the server's limit for this model.`
    : "Runs until Stop.";
}

/** The longest rollout the model's limits allow: its `max_frames` rounded down to its
 * chunk lattice (9, 21, 33, … frames), at its fps; null where it lists no limit. */
function longest(lim) {
  if (lim.max_frames == null) return null;
  const every = lim.frame_multiple || 1;
  const chunks = Math.floor((lim.max_frames - lim.frame_offset) / every);
  const frames = chunks >= 0 ? lim.frame_offset + chunks * every : lim.max_frames;
  const seconds = Number((frames / lim.default_fps).toFixed(1));
  return { frames, text: `${frames} frames (${seconds} s)` };
}

function status(text) {
  $("world-status").textContent = text;
}

/** The `avc1.PPCCLL` codec string of an init segment, from its avcC box. */
function codecOf(bytes) {
  for (let i = 0; i + 8 < bytes.length; i++) {
    if (bytes[i] === 0x61 && bytes[i + 1] === 0x76 && bytes[i + 2] === 0x63 && bytes[i + 3] === 0x43) {
      const hex = (b) => b.toString(16).padStart(2, "0");
      return `avc1.${hex(bytes[i + 5])}${hex(bytes[i + 6])}${hex(bytes[i + 7])}`;
    }
  }
  return "avc1.42e01e";
}

class Session {
  constructor(ws, video) {
    this.ws = ws;
    this.video = video;
    this.source = new MediaSource();
    this.buffer = null;
    this.queue = [];
    this.meta = null;
    this.ended = false;
    this.chunks = 0;
    this.latencies = [];
    this.actions = new Map();
    this.sent = 0;
    this.limit = null; // the model's longest rollout, asked for (`longest`)
    this.endedBy = null; // why the session ended, when the server ended it
    this.opened = new Promise((resolve) => {
      this.source.addEventListener("sourceopen", resolve, { once: true });
    });
    video.src = URL.createObjectURL(this.source);
    this.ping = setInterval(() => this.send({ type: "session.ping" }), 15000);
  }

  send(message) {
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(message));
  }

  onText(event) {
    switch (event.type) {
      case "video.start": {
        const c = event.config;
        status(`streaming ${c.width}x${c.height} at ${c.fps} fps until Stop ` +
          `(at most ${c.chunks} chunks)`);
        break;
      }
      case "video.chunk_metadata":
        this.meta = event;
        break;
      case "session.interaction.queued": {
        const key = this.actions.get(event.event_id) ?? "?";
        $("world-action").textContent = `${key} acknowledged (${event.event_id})`;
        $("world-action").dataset.state = "queued";
        log(`${key}: queued by the server as ${event.event_id}`);
        break;
      }
      case "session.done": {
        this.ended = true;
        const done = `done: ${event.chunks} chunk${event.chunks === 1 ? "" : "s"}`;
        if (event.stopped) {
          status(`${done} (stopped)`);
        } else {
          this.endedBy = `the server's limit for this model, ${this.limit?.text ?? "its length"}`;
          status(`${done}: the session reached ${this.endedBy}; press Start for a new one`);
          log(`the session reached ${this.endedBy}`);
        }
        this.pump();
        this.ws.close(1000);
        break;
      }
      case "error":
        if (event.code === "interaction_too_late") {
          const key = this.actions.get(event.event_id) ?? "?";
          $("world-action").textContent = `${key} too late: the rollout's last chunk was made`;
          $("world-action").dataset.state = "late";
          log(`${key}: too late (${event.message})`);
          break;
        }
        if (event.code === "session_expired") { // the server's session time limit
          this.ended = true;
          this.endedBy = `the server's session time limit (${event.message})`;
          status(`ended: ${this.endedBy}; press Start for a new one`);
          this.pump();
        } else {
          status(`error: ${event.message}${event.code ? ` (${event.code})` : ""}`);
        }
        log(`error ${event.code ?? ""}: ${event.message}`);
        break;
      default:
        break;
    }
  }

  async onBinary(data) {
    const meta = this.meta;
    this.meta = null;
    await this.opened;
    if (!this.buffer) {
      const mime = `video/mp4; codecs="${codecOf(new Uint8Array(data))}"`;
      if (!MediaSource.isTypeSupported(mime)) {
        status(`this browser cannot play ${mime} through Media Source Extensions`);
        return;
      }
      this.buffer = this.source.addSourceBuffer(mime);
      this.buffer.addEventListener("updateend", () => this.pump());
      log(`playing ${mime}`);
    }
    this.queue.push(data);
    this.pump();
    if (meta?.kind !== "media") return;
    this.chunks += 1;
    const latency = Date.now() - meta.produced_at * 1000;
    this.latencies.push(latency);
    const mean = this.latencies.reduce((a, b) => a + b, 0) / this.latencies.length;
    $("world-chunks").textContent = String(this.chunks);
    $("world-latency").textContent =
      `${Math.round(latency)} ms (mean ${Math.round(mean)} ms over ${this.latencies.length})`;
    for (const id of meta.started_event_ids ?? []) {
      log(`${this.actions.get(id) ?? id}: applied from chunk ${meta.generation_chunk_index}`);
    }
  }

  pump() {
    const buffer = this.buffer;
    if (!buffer || buffer.updating) return;
    if (this.queue.length) {
      buffer.appendBuffer(this.queue.shift());
      if (this.video.paused) this.video.play().catch(() => {});
    } else if (this.ended && this.source.readyState === "open") {
      this.source.endOfStream();
    }
  }

  closed(event) {
    clearInterval(this.ping);
    if (!this.ended) status(`closed (${event.code}${event.reason ? ` ${event.reason}` : ""})`);
    $("world-start").disabled = false;
    $("world-stop").disabled = true;
  }
}

async function start() {
  const model = served.get($("world-model").value);
  const [width, height] = $("world-size").value.split("x").map(Number);
  const limit = longest(model.limits);
  const message = {
    type: "session.start",
    model: model.id,
    prompt: $("world-prompt").value,
    width,
    height,
    num_frames: limit?.frames, // until Stop, within the server's limit
    fps: model.limits.default_fps,
    seed: Math.floor(Math.random() * 2 ** 31),
  };
  if (session && session.ws.readyState <= WebSocket.OPEN) session.ws.close(1000);
  const ws = openSocket("/v1/realtime/video");
  const current = new Session(ws, $("world-video"));
  current.limit = limit;
  session = current;
  $("world-chunks").textContent = "0";
  $("world-latency").textContent = "–";
  $("world-action").textContent = "–";
  $("world-start").disabled = true;
  status("connecting…");
  ws.addEventListener("open", () => {
    current.send(message);
    $("world-stop").disabled = false;
    document.querySelector(".wasd button").focus(); // out of the prompt: w/a/s/d steer
    status(`starting ${width}x${height}…`);
  });
  ws.addEventListener("message", (m) => {
    if (typeof m.data === "string") current.onText(JSON.parse(m.data));
    else current.onBinary(m.data);
  });
  ws.addEventListener("close", (e) => current.closed(e));
}

/** Send one interaction: a w/a/s/d camera key (`event` left out), or `event` itself (a
 * new prompt), labelled `label` in the log and the "Last action" line. */
function interact(label, event = { camera: [[label], [label], [label]] }) {
  if (!session || session.ws.readyState !== WebSocket.OPEN) {
    let why = session ? "the session has ended" : "no session is running";
    if (session?.endedBy) why = `the session ended at ${session.endedBy}`;
    $("world-action").textContent = `${label} not sent: ${why}; press Start for a new one`;
    $("world-action").dataset.state = "ended";
    return;
  }
  session.sent += 1;
  const id = `${"prompt" in event ? "prompt" : label}-${session.sent}`;
  session.actions.set(id, label);
  session.send({ type: "session.interaction", interaction: { event_id: id, event } });
  $("world-action").textContent = `${label} sent`;
  $("world-action").dataset.state = "sent";
}
