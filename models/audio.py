"""Wire schemas of the audio endpoints.

* ``/v1/audio/generations``: async audio jobs, the video job lifecycle with object
  ``"audio"`` (omniqueue's own shape, field names following ``/v1/videos``).
* ``/v1/audio/speech``: the OpenAI text-to-speech request (``model, input, voice,
  instructions, response_format, speed, stream_format``), plus every field of vLLM-Omni's
  ``OpenAICreateSpeechRequest`` (``stream``, ``sample_rate``, ``seed``, ``task_type``,
  ``language``, ``ref_audio``, ``max_new_tokens``, …) and ``num_inference_steps``.
* ``/v1/audio/generate``: vLLM-Omni's synchronous diffusion audio request
  (``OpenAICreateAudioGenerateRequest``: ``input, model, response_format, speed,
  stream_format, audio_length, audio_start, negative_prompt, guidance_scale,
  num_inference_steps, seed``), plus ``sample_rate``, ``extra_params`` and ``timeout``.

Values are checked against the served model by ``api/audio_validation.py``, so range and
choice errors name their parameter in the OpenAI error body; the types here only parse.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from models.common import (
    Deleted,
    Int,
    JobObject,
    JobRequestOptions,
    ListPage,
    Number,
)
from models.webhooks import WebhookFields

AudioFormat = Literal["wav", "mp3", "flac", "opus", "aac", "pcm"]
AUDIO_FORMATS: tuple[str, ...] = ("wav", "mp3", "flac", "opus", "aac", "pcm")
# Content-Type of each format's bytes (Opus is in Ogg, AAC in ADTS, PCM is raw s16le).
MEDIA_TYPES = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "flac": "audio/flac",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "pcm": "audio/pcm",
}
EXTENSIONS = {fmt: fmt for fmt in AUDIO_FORMATS}  # opus: Ogg Opus files end in .opus
# Sample rates each codec takes (None: any).
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
AAC_RATES = (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200,
             96000)  # fmt: skip
SAMPLE_RATES: dict[str, tuple[int, ...] | None] = {
    "wav": None,
    "pcm": None,
    "flac": None,
    "mp3": MP3_RATES,
    "opus": OPUS_RATES,
    "aac": AAC_RATES,
}
# What a request may ask for; the model's own rate may be anything (it is converted).
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 8000, 192_000
# A speech request's ``language`` (vLLM-Omni's names, "English", …, or ISO 639-1 codes,
# any case) → the ISO 639-1 code a model that declares ``language`` gets. "Auto" (or no
# language) leaves the model's own: English for every built-in model.
SPEECH_LANGUAGES = {
    name: code
    for code, names in {
        "en": ("english", "en", "en-us", "en-gb"),
        "zh": ("chinese", "mandarin", "zh", "zh-cn", "cmn"),
        "ja": ("japanese", "ja"),
        "ko": ("korean", "ko"),
        "fr": ("french", "fr"),
        "de": ("german", "de"),
        "es": ("spanish", "es"),
        "it": ("italian", "it"),
        "pt": ("portuguese", "pt"),
        "ru": ("russian", "ru"),
    }.items()
    for name in names
}


class AudioCreate(JobRequestOptions):
    """A ``POST /v1/audio/generations`` body (JSON, or multipart with string values)."""

    # extra_params, timeout, webhook_url/webhook_events: from JobRequestOptions.

    prompt: str
    model: str | None = None
    # Clip length in seconds (default: the model's).
    seconds: Number | None = None
    num_inference_steps: Int | None = None
    seed: Int | None = None
    guidance_scale: Number | None = None
    negative_prompt: str | None = None
    response_format: str = "wav"
    # Artifact sample rate (default: the model's, or the nearest one the format takes).
    sample_rate: Int | None = None
    # 1 (mono) or 2 (stereo); default: what the model makes.
    channels: Int | None = None


class SpeechCreate(WebhookFields):
    """``POST /v1/audio/speech``: OpenAI's text-to-speech request, plus every field of
    vLLM-Omni's ``OpenAICreateSpeechRequest`` (``protocol/audio.py``) so its TTS clients
    are not refused at parse time. Which of them a served model honours, ignores as a
    hint, or refuses is decided in ``api/audio_validation.py``."""

    # webhook_url/webhook_events: from WebhookFields; extra_params is its own (may be null).
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str
    # A voice name, or OpenAI's custom voice object ``{"id": "voice_…"}``; vLLM-Omni also
    # takes the name as ``speaker``.
    voice: str | dict[str, Any] | None = Field(
        default=None, validation_alias=AliasChoices("voice", "speaker")
    )
    instructions: str | None = None
    response_format: str = "mp3"
    speed: Number | None = 1.0
    stream_format: Literal["sse", "audio"] | None = None
    # vLLM-Omni extensions
    stream: bool = False
    sample_rate: Int | None = None
    seed: Int | None = None
    num_inference_steps: Int | None = None
    task_type: Literal["CustomVoice", "VoiceDesign", "Base"] | None = None
    language: str | None = None
    ref_audio: str | list[str] | None = None
    ref_text: str | None = None
    ref_audio_2: str | None = None
    ambient_sound: str | None = None
    duration_seconds: Number | None = None
    x_vector_only_mode: bool | None = None
    speaker_embedding: list[float] | list[list[float]] | None = None
    max_new_tokens: Int | None = None
    initial_codec_chunk_frames: Int | None = None
    non_streaming_mode: bool | None = None
    extra_params: dict[str, Any] | None = None
    word_timestamps: bool = False


class AudioGenerate(JobRequestOptions):
    """``POST /v1/audio/generate``: vLLM-Omni's synchronous diffusion audio request."""

    # omniqueue extensions: sample_rate, and the JobRequestOptions fields.

    input: str
    model: str | None = None
    response_format: str = "wav"
    speed: Number | None = 1.0
    stream_format: str | None = "audio"
    audio_length: Number | None = None
    audio_start: Number | None = 0.0
    negative_prompt: str | None = None
    guidance_scale: Number | None = None
    num_inference_steps: Int | None = None
    seed: Int | None = None
    sample_rate: Int | None = None


class AudioObject(JobObject):
    object: Literal["audio"] = "audio"
    response_format: AudioFormat = "wav"
    media_type: str = "audio/wav"
    # Of the artifact; the requested values until the job has completed (None: the
    # model's own, known once it has).
    sample_rate: int | None = None
    channels: int | None = None


class AudioPage(ListPage[AudioObject]):
    pass


class AudioDeleted(Deleted):
    object: Literal["audio.deleted"] = "audio.deleted"


class SpeechAudioDelta(BaseModel):
    """OpenAI's ``stream_format="sse"`` event: base64 PCM16 of the next piece."""

    type: Literal["speech.audio.delta"] = "speech.audio.delta"
    audio: str


class SpeechAudioDone(BaseModel):
    """OpenAI's end of a ``stream_format="sse"`` stream. OpenAI's event also has ``usage``
    (tokens of its token-based TTS models); no model here counts tokens, so the event
    leaves it out rather than say 0."""

    type: Literal["speech.audio.done"] = "speech.audio.done"
