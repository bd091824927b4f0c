// Jobs: a form built from the model's limits (`GET /v1/models`), and the API's own job
// lists (cursor paging), each running job followed through its SSE events.
import { api, el, fillModels, getKey, jobEvents } from "./api.js";

const KINDS = {
  video: { path: "/v1/videos", list: "video-jobs", more: "video-jobs-more" },
  audio: { path: "/v1/audio/generations", list: "audio-jobs", more: "audio-jobs-more" },
};
const SIZES = [[256, 144], [480, 272], [512, 512], [640, 360], [832, 480], [1280, 720]];
// Jobs per page of each list; `/?limit=N` sets another (1–100).
const PAGE_SIZE = Number(new URLSearchParams(location.search).get("limit")) || 10;
const $ = (id) => document.getElementById(id);
const cards = new Map();
const cursors = {};
let served = new Map();

export async function init() {
  const list = await fillModels($("job-model"), (m) => m.kind === "job");
  served = new Map(list.map((m) => [m.id, m]));
  $("job-model").addEventListener("change", () => applyModel(served.get($("job-model").value)));
  if (list.length) applyModel(list[0]);
  $("job-form").addEventListener("submit", (event) => {
    event.preventDefault();
    submit(served.get($("job-model").value));
  });
  for (const kind of Object.keys(KINDS)) {
    $(KINDS[kind].more).addEventListener("click", () => loadPage(kind));
  }
  await Promise.all(Object.keys(KINDS).map((kind) => loadPage(kind)));
}

function kindOf(model) {
  return model.modality === "audio" ? "audio" : "video";
}

/** Show the fields the model takes, with its limits as bounds and defaults as hints. */
function applyModel(model) {
  const lim = model.limits;
  const kind = kindOf(model);
  for (const label of document.querySelectorAll("#job-form [data-for]")) {
    const wanted = label.dataset.for;
    label.hidden = wanted === "reference" ? !lim.supports_image_input : wanted !== kind;
  }
  if (kind === "video") { // an audio model's limits have no size (its field is hidden)
    const size = $("job-size");
    size.placeholder = lim.default_size;
    const fits = ([w, h]) => w <= lim.max_width && h <= lim.max_height &&
      w % lim.size_multiple === 0 && h % lim.size_multiple === 0;
    const sizes = [lim.default_size, ...SIZES.filter(fits).map(([w, h]) => `${w}x${h}`)];
    $("job-sizes").replaceChildren(...[...new Set(sizes)].map((s) => el("option", { value: s })));
  }
  const seconds = $("job-seconds");
  seconds.min = "0.05";
  seconds.max = lim.max_seconds ?? "";
  seconds.placeholder = String(lim.default_seconds);
  const steps = $("job-steps");
  Object.assign(steps, { min: lim.min_steps, max: lim.max_steps, placeholder: lim.default_steps });
  const parts = [model.description.split(":")[0]];
  if (kind === "video") {
    parts.push(`sizes ${lim.min_size}–${lim.max_width} × ${lim.min_size}–${lim.max_height}, ` +
      `multiples of ${lim.size_multiple}`);
    parts.push(`up to ${lim.max_frames} frames at ${lim.default_fps} fps`);
  }
  if (lim.max_seconds) parts.push(`up to ${lim.max_seconds} s`);
  parts.push(`steps ${lim.min_steps}–${lim.max_steps}`);
  $("job-model-info").textContent = parts.filter(Boolean).join(" · ");
}

async function submit(model) {
  const status = $("job-form-status");
  const kind = kindOf(model);
  const fields = { model: model.id, prompt: $("job-prompt").value };
  const number = (id) => ($(id).value.trim() === "" ? undefined : Number($(id).value));
  if (kind === "video" && $("job-size").value.trim()) fields.size = $("job-size").value.trim();
  if (kind === "audio") fields.response_format = $("job-format").value;
  fields.seconds = number("job-seconds");
  fields.num_inference_steps = number("job-steps");
  fields.seed = number("job-seed");
  const file = model.limits.supports_image_input ? $("job-reference").files[0] : undefined;
  for (const input of document.querySelectorAll("#job-form [aria-invalid]")) {
    input.removeAttribute("aria-invalid");
  }
  $("job-generate").disabled = true;
  status.textContent = "submitting…";
  try {
    let job;
    if (file) {
      const form = new FormData();
      for (const [name, value] of Object.entries(fields)) {
        if (value !== undefined) form.append(name, String(value));
      }
      form.append("input_reference", file);
      job = await api(KINDS[kind].path, { method: "POST", form });
    } else {
      job = await api(KINDS[kind].path, { method: "POST", json: fields });
    }
    status.textContent = `created ${job.id}`;
    addCard(kind, job, true);
  } catch (e) {
    status.textContent = e.param ? `${e.param}: ${e.message}` : e.message;
    const field = e.param && document.querySelector(`#job-form [name="${e.param}"]`);
    if (field) field.setAttribute("aria-invalid", "true");
  } finally {
    $("job-generate").disabled = false;
  }
}

async function loadPage(kind) {
  const query = new URLSearchParams({ limit: String(PAGE_SIZE) });
  if (cursors[kind]) query.set("after", cursors[kind]);
  const page = await api(`${KINDS[kind].path}?${query}`);
  for (const job of page.data) addCard(kind, job, false);
  cursors[kind] = page.last_id;
  $(KINDS[kind].more).hidden = !page.has_more;
}

const finished = (job) => job.status === "completed" || job.status === "failed";

function addCard(kind, job, onTop) {
  if (cards.has(job.id)) return;
  const progress = el("progress", { max: "100", value: String(job.progress ?? 0) });
  progress.setAttribute("aria-label", `Progress of ${job.id}`);
  const card = {
    kind,
    job,
    eta: null,
    status: el("p", { class: "status", role: "status" }),
    progress,
    preview: el("img", { class: "preview", hidden: true, alt: "" }),
    cancel: el("button", { type: "button", text: "Cancel" }),
    media: el("div", { class: "media" }),
  };
  let what = kind === "video" ? `${job.size} · ${job.seconds} s` : `${job.seconds} s`;
  if (job.n > 1) what += ` · ${job.n} outputs`;
  card.node = el(
    "li",
    { class: "job", "data-id": job.id },
    el("p", { class: "prompt", text: job.prompt }),
    el("p", { class: "meta", text: `${job.id} · ${job.model} · ${what}` }),
    card.status,
    card.progress,
    card.preview,
    el("div", { class: "actions" }, card.cancel),
    card.media,
  );
  card.cancel.addEventListener("click", () => cancel(card));
  cards.set(job.id, card);
  const list = $(KINDS[kind].list);
  if (onTop) list.prepend(card.node);
  else list.append(card.node);
  render(card);
  if (!finished(job)) follow(card);
}

function statusText(job, eta) {
  if (job.status === "queued") {
    const parts = [];
    if (job.queue_position != null) parts.push(`position ${job.queue_position}`);
    if (job.estimated_start_at != null) {
      const wait = Math.max(0, Math.round(job.estimated_start_at - Date.now() / 1000));
      parts.push(`starts in ~${wait} s`);
    }
    return parts.length ? `queued (${parts.join(", ")})` : "queued";
  }
  if (job.status === "in_progress") {
    const parts = ["in progress", job.stage];
    if (job.step) parts.push(`step ${job.step}/${job.num_inference_steps}`);
    parts.push(`${job.progress ?? 0} %`);
    if (eta !== null) parts.push(`ETA ${Math.max(0, Math.round(eta))} s`);
    return parts.join(" · ");
  }
  if (job.status === "completed") {
    const took = job.inference_time_s ? ` in ${job.inference_time_s.toFixed(1)} s` : "";
    return `completed · 100 %${took}`;
  }
  if (job.error?.code === "cancelled") return "cancelled";
  return `failed: ${job.error?.message ?? "unknown error"}`;
}

function render(card) {
  const job = card.job;
  card.status.textContent = statusText(job, card.eta);
  card.node.dataset.status = job.error?.code === "cancelled" ? "cancelled" : job.status;
  card.progress.value = job.status === "completed" ? 100 : job.progress ?? 0;
  card.progress.textContent = `${card.progress.value} %`;
  card.cancel.hidden = finished(job);
  if (job.status === "completed" && !card.shown) {
    card.shown = true;
    showMedia(card).catch((e) => card.media.replaceChildren(el("p", { text: e.message })));
  }
}

/** Follow the job's events until `done`, then read the job itself (the row is the truth). */
async function follow(card) {
  const { job } = card;
  let first = null;
  const signal = new AbortController().signal;
  try {
    for await (const event of jobEvents(`${KINDS[card.kind].path}/${job.id}/events`, signal)) {
      const data = event.data;
      if (event.type === "status") {
        if (data.status !== "queued" || job.status === "queued") job.status = data.status;
        job.queue_position = data.queue_position;
        job.estimated_start_at = data.estimated_start_at ?? null;
      } else if (event.type === "progress") {
        // Progress means it runs, even where the worker's `in_progress` status event was
        // written before the API's `queued` one (a claim right after the publish).
        if (job.status === "queued") job.status = "in_progress";
        Object.assign(job, { progress: data.progress, step: data.step, stage: data.stage });
        job.num_inference_steps = data.num_steps;
        const now = performance.now();
        first ??= { at: now, progress: data.progress };
        const done = data.progress - first.progress;
        card.eta = done > 0 && data.progress < 100
          ? ((now - first.at) / done) * (100 - data.progress) / 1000 : null;
      } else if (event.type === "preview") {
        card.preview.src = `data:image/jpeg;base64,${data.jpeg_b64}`;
        card.preview.alt = `Preview at step ${data.step}`;
        card.preview.hidden = false;
      } else if (event.type === "done") {
        card.eta = null;
        Object.assign(job, { status: data.status, error: data.error ?? null });
      }
      render(card);
    }
  } catch (e) {
    card.status.textContent = `${statusText(job, null)} (events: ${e.message})`;
  }
  card.job = await api(`${KINDS[card.kind].path}/${job.id}`);
  card.eta = null;
  render(card);
}

async function cancel(card) {
  card.cancel.disabled = true;
  try {
    card.job = await api(`${KINDS[card.kind].path}/${card.job.id}/cancel`, { method: "POST" });
    render(card);
  } catch (e) {
    card.status.textContent = `cancel failed: ${e.message}`;
  } finally {
    card.cancel.disabled = false;
  }
}

/** Each finished output in a player, with a download link: one for an audio job or an
 * `n = 1` video, `n` for a video job of `n` outputs (`…/content?index=k`, seed + k). */
async function showMedia(card) {
  const { job, kind } = card;
  const outputs = kind === "video" && job.outputs?.length ? job.outputs : [{ index: 0 }];
  const shown = await Promise.all(outputs.map((o) => outputMedia(card, o.index, outputs.length)));
  if (outputs.length === 1) {
    card.media.replaceChildren(...shown[0]);
    return;
  }
  card.media.replaceChildren(...outputs.map(({ index, seed }, k) => el(
    "figure",
    { class: "output", "data-index": String(index) },
    el("figcaption", { text: `Output ${index + 1} of ${outputs.length} · seed ${seed}` }),
    ...shown[k],
  )));
}

/** A player and a download link of output `index` of `count`. With a key the file is
 * fetched with the bearer header (a media element cannot send one). */
async function outputMedia({ job, kind }, index, count) {
  const url = `${KINDS[kind].path}/${job.id}/content`;
  let src = index ? `${url}?index=${index}` : url;
  if (getKey()) {
    const query = new URLSearchParams({ redirect: "false" }); // not a cross-origin S3 URL
    if (index) query.set("index", String(index));
    const file = await api(`${url}?${query}`, { raw: true });
    src = URL.createObjectURL(await file.blob());
  }
  const player = el(kind, { controls: true, preload: "auto", src });
  const name = count > 1 ? `${job.id}-${index}` : job.id;
  const label = count > 1 ? `Output ${index + 1} of ${job.id}` : `Result of ${job.id}`;
  player.setAttribute("aria-label", label);
  const ext = kind === "video" ? "mp4" : job.response_format || "wav";
  return [player, el("a", { href: src, download: `${name}.${ext}`, text: "Download" })];
}
