// Talk: `WS /v1/realtime` (OpenAI Realtime events). The microphone (or a WAV file, sent
// in real time) goes up as 100 ms PCM16 appends at 24 kHz; the server's VAD takes turns,
// and the answer's audio deltas are played as they arrive. Speaking over an answer
// interrupts it: the server cancels the response (barge-in) and the page drops what it
// has not played yet. A file (or a bundled sample, for people without a microphone) in
// which the server's VAD hears no speech says so, instead of nothing happening.
import { fillModels, logLine, openSocket } from "./api.js";

const RATE = 24000;
const CHUNK = RATE / 10; // samples in one 100 ms append
const $ = (id) => document.getElementById(id);
let ws = null;
let ctx = null;
let mic = null;
let worklet = null;
let pending = new Float32Array(0);
let fileTimer = null;
let sources = [];
let playEnd = 0;
// The answer being received: seconds of its audio received, and played (heard) so far.
let reply = { received: 0, played: 0 };
let speechSeen = false; // a speech_started since the current file began
let quietTimer = null;
// After a file's last append: the VAD's onset latency plus its silence window, and slack.
const NO_SPEECH_AFTER_MS = 1500;

export async function init() {
  const voices = await fillModels($("talk-model"), (m) => m.kind === "voice");
  if (!voices.length) $("talk-conn").textContent = "no realtime voice model is served";
  $("talk-connect").addEventListener("click", connect);
  $("talk-disconnect").addEventListener("click", () => ws?.close(1000));
  $("talk-mic").addEventListener("click", () => toggleMic().catch(
    (e) => log(`microphone: ${e.message}`)));
  $("talk-send").addEventListener("click", () => sendFile().catch((e) => log(`file: ${e.message}`)));
  $("talk-send-sample").addEventListener("click", () => sendSample().catch(
    (e) => log(`sample: ${e.message}`)));
  $("talk-file").addEventListener("change", buttons);
}

const log = (text) => logLine($("talk-log"), text);
const open = () => ws?.readyState === WebSocket.OPEN;

function buttons() {
  $("talk-connect").disabled = Boolean(ws);
  $("talk-disconnect").disabled = !ws;
  $("talk-mic").disabled = !open();
  $("talk-send").disabled = !open() || !$("talk-file").files.length;
  $("talk-send-sample").disabled = !open();
}

function audio() {
  ctx ??= new AudioContext({ sampleRate: RATE });
  ctx.resume();
  return ctx;
}

function setAnswer(text, state) {
  $("talk-answer").textContent = text;
  $("talk-answer").dataset.state = state;
}

function connect() {
  audio();
  const model = $("talk-model").value;
  let opened = false;
  ws = openSocket(`/v1/realtime?model=${encodeURIComponent(model)}`);
  $("talk-conn").textContent = "connecting…";
  buttons();
  ws.addEventListener("open", () => {
    opened = true;
    $("talk-conn").textContent = "open";
    const voice = $("talk-voice").value;
    send({ type: "session.update", session: { type: "realtime", audio: { output: { voice } } } });
    buttons();
  });
  ws.addEventListener("message", (m) => onEvent(JSON.parse(m.data)));
  ws.addEventListener("close", (e) => {
    const why = opened ? `${e.code}${e.reason ? ` ${e.reason}` : ""}` : "refused: is the API key right?";
    $("talk-conn").textContent = `closed (${why})`;
    ws = null;
    stopFile();
    if (mic) toggleMic();
    buttons();
  });
}

function send(event) {
  if (open()) ws.send(JSON.stringify(event));
}

function base64(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(text);
}

/** Float samples in [-1, 1] as one `input_audio_buffer.append` of PCM16. */
function append(samples) {
  const pcm = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    pcm[i] = s < 0 ? s * 0x8000 : s * 0x7fff;
  }
  send({ type: "input_audio_buffer.append", audio: base64(new Uint8Array(pcm.buffer)) });
}

function push(samples) {
  const joined = new Float32Array(pending.length + samples.length);
  joined.set(pending);
  joined.set(samples, pending.length);
  let at = 0;
  for (; at + CHUNK <= joined.length; at += CHUNK) append(joined.subarray(at, at + CHUNK));
  pending = joined.slice(at);
}

async function toggleMic() {
  const button = $("talk-mic");
  if (mic) {
    mic.stream.getTracks().forEach((t) => t.stop());
    mic.source.disconnect();
    mic = null;
    button.setAttribute("aria-pressed", "false");
    log("microphone off");
    return;
  }
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
  });
  const c = audio();
  worklet ??= c.audioWorklet.addModule("/static/talk-worklet.js");
  await worklet;
  const source = c.createMediaStreamSource(stream);
  const tap = new AudioWorkletNode(c, "omniqueue-tap");
  tap.port.onmessage = (e) => push(e.data);
  const mute = c.createGain();
  mute.gain.value = 0; // pulled by the destination, heard by nobody
  source.connect(tap).connect(mute).connect(c.destination);
  mic = { stream, source };
  button.setAttribute("aria-pressed", "true");
  log("microphone on: speak");
}

function stopFile() {
  clearInterval(fileTimer);
  fileTimer = null;
  clearTimeout(quietTimer);
  quietTimer = null;
}

async function sendFile() {
  const file = $("talk-file").files[0];
  await sendAudio(file.name, await file.arrayBuffer());
}

/** One of the bundled speech samples (the test suite's fixtures, espeak-ng voices). */
async function sendSample() {
  const name = $("talk-sample").value;
  const response = await fetch(`/static/speech/${name}`);
  if (!response.ok) throw new Error(`${name}: HTTP ${response.status}`);
  await sendAudio(name, await response.arrayBuffer());
}

/** Say so when the server's VAD heard nothing in what was sent. */
function noSpeech(name) {
  quietTimer = null;
  if (speechSeen) return;
  $("talk-vad").textContent = "no speech detected";
  log(`no speech detected in ${name}: the server heard nothing it could answer. ` +
    "Try a louder recording, or one of the samples.");
}

/** Send audio as a microphone would: 100 ms of audio every 100 ms. */
async function sendAudio(name, bytes) {
  const decoded = await audio().decodeAudioData(bytes); // now at 24 kHz
  const samples = new Float32Array(decoded.length + RATE / 2); // and 500 ms of silence
  samples.set(decoded.getChannelData(0));
  stopFile();
  speechSeen = false;
  log(`sending ${name} (${decoded.duration.toFixed(1)} s) in real time`);
  const start = performance.now();
  let sent = 0;
  fileTimer = setInterval(() => {
    const due = Math.min(samples.length, ((performance.now() - start) / 1000) * RATE);
    while (sent < due) {
      append(samples.subarray(sent, sent + CHUNK));
      sent += CHUNK;
    }
    if (sent >= samples.length) {
      stopFile();
      log(`${name} sent`);
      quietTimer = setTimeout(() => noSpeech(name), NO_SPEECH_AFTER_MS);
    }
  }, 50);
}

function play(delta) {
  const bytes = Uint8Array.from(atob(delta), (c) => c.charCodeAt(0));
  const pcm = new Int16Array(bytes.buffer, 0, bytes.length >> 1);
  const c = audio();
  const buffer = c.createBuffer(1, pcm.length, RATE);
  const channel = buffer.getChannelData(0);
  for (let i = 0; i < pcm.length; i++) channel[i] = pcm[i] / 32768;
  const source = c.createBufferSource();
  source.buffer = buffer;
  source.connect(c.destination);
  const at = Math.max(c.currentTime + 0.05, playEnd);
  source.start(at);
  playEnd = at + buffer.duration;
  const answer = reply;
  answer.received += buffer.duration;
  showReplyAudio();
  sources.push(source);
  source.onended = () => {
    sources = sources.filter((s) => s !== source);
    answer.played += buffer.duration;
    if (answer === reply) showReplyAudio();
  };
}

/** The answer's audio in one unit: how much arrived, and how much of it was played. */
function showReplyAudio() {
  const s = (seconds) => `${seconds.toFixed(1)} s`;
  $("talk-audio").textContent = `${s(reply.received)} received · ${s(reply.played)} played`;
}

/** Drop what is queued for playback (the answer was interrupted). */
function stopPlayback() {
  for (const source of sources) {
    source.onended = null;
    source.stop();
  }
  sources = [];
  playEnd = 0;
}

function onEvent(event) {
  switch (event.type) {
    case "session.created":
      log(`session ${event.session.id} (${event.session.model})`);
      break;
    case "input_audio_buffer.speech_started":
      speechSeen = true;
      $("talk-vad").textContent = "speech";
      if (sources.length) {
        stopPlayback();
        log("you spoke over the answer: barge-in");
      }
      break;
    case "input_audio_buffer.speech_stopped":
      $("talk-vad").textContent = "silence";
      break;
    case "input_audio_buffer.committed":
      log("turn committed");
      break;
    case "response.created":
      reply = { received: 0, played: 0 };
      showReplyAudio();
      $("talk-transcript").textContent = "";
      setAnswer("thinking…", "created");
      log(`response ${event.response.id} started`);
      break;
    case "response.output_audio.delta":
      play(event.delta);
      setAnswer("speaking", "speaking");
      break;
    case "response.output_audio_transcript.delta":
      $("talk-transcript").append(event.delta);
      break;
    case "response.done": {
      const { status, status_details: details } = event.response;
      const reason = details?.reason ? ` (${details.reason})` : "";
      if (status !== "completed") stopPlayback();
      setAnswer(`${status}${reason}`, status);
      log(`response ${event.response.id} ${status}${reason}`);
      break;
    }
    case "error":
      log(`error: ${event.error?.message ?? JSON.stringify(event)}`);
      break;
    default:
      break;
  }
}
