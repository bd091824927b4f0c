"""The served models' specs, as data: the built-in reference models' and each adapter
family's defaults (a registry entry starts from its family's spec). :class:`ModelSpec`
and its names live in ``models/model_spec.py`` and are re-exported here.
"""

from __future__ import annotations

from typing import Any

from models.model_spec import (
    CUDNN_FAMILIES,
    DEFAULT_VSA_TOPK,
    MAX_OUTPUTS,
    QUALITY_TIERS,
    VIDEO_WORKFLOWS,
    AttentionBackend,
    Modality,
    ModelSpec,
    PipelineKind,
    QualityTier,
    Workflow,
)

__all__ = [
    "BUILTIN_SPECS",
    "CUDNN_FAMILIES",
    "DEFAULT_VSA_TOPK",
    "FAMILY_SPECS",
    "MAX_OUTPUTS",
    "QUALITY_TIERS",
    "REFERENCE_AUDIO",
    "REFERENCE_SPEECH",
    "REFERENCE_VIDEO",
    "REFERENCE_VOICE",
    "REFERENCE_WORLD",
    "VIDEO_WORKFLOWS",
    "AttentionBackend",
    "Modality",
    "ModelSpec",
    "PipelineKind",
    "QualityTier",
    "Workflow",
]


REFERENCE_VIDEO = ModelSpec(
    name="reference/video",
    description=(
        "Procedural reference model: a flow-matching Euler sampler carries Gaussian noise "
        "toward a scene rendered from the prompt. CPU, no weights, deterministic per seed."
    ),
    min_size=16,
    max_width=1280,
    max_height=1280,
    size_multiple=2,
    default_size=(832, 480),
    default_fps=24,
    default_seconds=4.0,
    default_steps=30,
    max_steps=200,
    has_audio=True,
    supports_image_input=True,
    parameters=["guidance_scale", "negative_prompt"],
    extra_params={"motion": "float", "camera": "str"},
    extra_choices={"camera": ["static", "pan", "zoom"]},
    extra_ranges={"motion": (0.0, 10.0)},
)

REFERENCE_WORLD = ModelSpec(
    name="reference/world",
    description=(
        "Procedural reference world model for streaming sessions: a scene rendered from the "
        "prompt, steered by w/a/s/d camera actions, delivered in chunks of flow-matching "
        "Euler steps. CPU, no weights, deterministic per seed."
    ),
    streaming=True,
    min_size=16,
    max_width=1280,
    max_height=1280,
    size_multiple=16,
    default_size=(480, 272),
    frame_multiple=12,  # the chunk lattice: 9, 21, 33, ... frames
    frame_offset=9,
    min_frames=9,
    max_frames=957,  # 80 chunks, about a minute at 16 fps
    default_fps=16,
    default_seconds=189 / 16,  # 16 chunks
    min_steps=1,
    max_steps=50,
    default_steps=4,  # Euler steps per chunk
    supports_image_input=True,
    camera_control=True,
    # A prompt or camera change enters the chunk under way (rendered again) while one of
    # its steps is left.
    interaction_at="step",
    parameters=["negative_prompt"],
    extra_params={"flow_shift": "float"},
    extra_ranges={"flow_shift": (0.1, 20.0)},
)

REFERENCE_VOICE = ModelSpec(
    name="reference/voice",
    modality="audio",
    description=(
        "Weight-free reference voice responder for realtime audio sessions (WS /v1/realtime): "
        "answers each user turn with speech-like audio (a source-filter vowel synthesizer) "
        "whose length and pitch contour derive from that turn, plus a fixed acknowledgement "
        "transcript. CPU, no weights, deterministic."
    ),
    streaming=True,
    parameters=["voice", "speed", "instructions"],
)

REFERENCE_AUDIO = ModelSpec(
    name="reference/audio",
    modality="audio",
    description=(
        "Procedural reference audio model: a flow-matching Euler sampler carries Gaussian "
        "noise toward music and textures composed from the prompt's words. CPU, no weights, "
        "deterministic per seed."
    ),
    default_seconds=5.0,
    max_seconds=60.0,
    default_steps=20,
    max_steps=200,
    has_audio=True,
    parameters=["guidance_scale", "negative_prompt", "speed", "voice", "instructions"],
    extra_params={"bpm": "float"},
    extra_ranges={"bpm": (30.0, 300.0)},
)

REFERENCE_SPEECH = ModelSpec(
    name="reference/speech",
    modality="audio",
    description=(
        "Built-in text-to-speech: eSpeak NG (the 'speech' extra, or espeak-ng on PATH) speaks "
        "the input phrase by phrase, one step per phrase, so PCM streams as it is spoken. "
        "CPU, no weights, deterministic."
    ),
    text_to_speech=True,
    default_seconds=5.0,
    max_seconds=120.0,
    min_steps=1,
    max_steps=200,
    default_steps=1,  # unused: a job has one step per phrase of its input
    # language: eSpeak NG's voice of that language (workers/pipelines/reference_speech.py).
    parameters=["speed", "voice", "language"],
)

BUILTIN_SPECS: dict[str, ModelSpec] = {
    REFERENCE_VIDEO.name: REFERENCE_VIDEO,
    REFERENCE_WORLD.name: REFERENCE_WORLD,
    REFERENCE_VOICE.name: REFERENCE_VOICE,
    REFERENCE_AUDIO.name: REFERENCE_AUDIO,
    REFERENCE_SPEECH.name: REFERENCE_SPEECH,
}


def _diffusers_video(name: str, **spec: Any) -> ModelSpec:
    """The spec of a diffusers video family: what they all share, then its own ``spec``.

    Every one has a ``1 + k × frame_multiple`` frame lattice (a first frame, then the
    VAE's temporal chunks), takes CFG with a negative prompt and the VAE's tiling and
    slicing switches, and runs text-to-video unless its registry entry names other
    workflows; unless its ``spec`` says otherwise it makes 5 s clips in 50 steps and
    offers the "high" and "fast" cache tiers.
    """
    shared: dict[str, Any] = {
        "quality_tiers": ["high", "fast"],
        "frame_offset": 1,
        "default_seconds": 5.0,
        "default_steps": 50,
        "parameters": ["guidance_scale", "negative_prompt", "vae_use_tiling", "vae_use_slicing"],
        "workflows": ["t2v"],
    }
    unknown = sorted(spec.keys() - ModelSpec.model_fields.keys())
    if unknown:  # ModelSpec ignores what it does not know; a family's spec must not
        raise TypeError(f"{name}: no ModelSpec field {', '.join(unknown)}")
    return ModelSpec(**{**shared, **spec, "name": name})


# Defaults per adapter family: a served model from the registry file starts from its
# family's spec, then applies the overrides given there. Values follow each pipeline's
# own constraints in diffusers (VAE/patch size → size multiple, temporal compression →
# frame lattice) and its documented defaults.
FAMILY_SPECS: dict[str, ModelSpec] = {
    "diffusers.wan": _diffusers_video(
        "diffusers.wan",
        size_multiple=16,
        default_size=(832, 480),
        frame_multiple=4,
        default_fps=16,
        # Wan 2.2 (two transformers) also takes guidance_scale_2 and boundary_ratio: add
        # them in the registry entry's [model.spec] parameters.
        parameters=[
            "guidance_scale",
            "negative_prompt",
            "flow_shift",
            "vae_use_tiling",
            "vae_use_slicing",
        ],
        # Text-to-video (WanPipeline) unless the entry names others: ["i2v"] (Wan 2.1 /
        # 2.2 I2V), ["flf2v"] (Wan 2.1 FLF2V), ["i2v", "flf2v"] (Wan 2.2 I2V A14B),
        # ["t2v", "i2v"] (Wan 2.2 TI2V-5B), ["t2v", "v2v"] (a one-transformer T2V with
        # WanVideoToVideoPipeline's loop); image workflows load WanImageToVideoPipeline
        # (workers/pipelines/diffusers/wan/adapter.py). strength: v2v's (its __call__ argument).
        extra_params={"frame_indices": "ints", "strength": "float"},
        extra_ranges={"strength": (0.0, 1.0)},
    ),
    "diffusers.ltx": _diffusers_video(
        "diffusers.ltx",
        size_multiple=32,
        default_size=(704, 480),
        frame_multiple=8,
        default_fps=25,
        # LTXPipeline.__call__ arguments of the same names (used by timestep-conditioned
        # VAEs); frame_indices places keyframes; strength: v2v's (LTXConditionPipeline's
        # conditioning strength of the source clip: 1 holds it, the reverse of Wan's).
        extra_params={
            "decode_timestep": "float",
            "decode_noise_scale": "float",
            "guidance_rescale": "float",
            "frame_indices": "ints",
            "strength": "float",
        },
        extra_ranges={
            "decode_timestep": (0.0, 1.0),
            "decode_noise_scale": (0.0, 1.0),
            "guidance_rescale": (0.0, 1.0),
            "strength": (0.0, 1.0),
        },
        # Text-to-video (LTXPipeline) unless the entry names others: ["t2v", "i2v"]
        # (LTXImageToVideoPipeline), any list with flf2v or v2v (LTXConditionPipeline,
        # LTX-Video 0.9.5+); workers/pipelines/diffusers/ltx/workflows.py.
    ),
    "diffusers.cogvideox": _diffusers_video(
        "diffusers.cogvideox",
        size_multiple=16,
        default_size=(720, 480),
        frame_multiple=4,
        default_fps=8,
        default_seconds=6.0,
        # use_dynamic_cfg: the pipelines' __call__ argument; frame_indices places i2v's
        # keyframe ([0]); strength: v2v's (CogVideoXVideoToVideoPipeline's, default 0.8).
        extra_params={"use_dynamic_cfg": "bool", "frame_indices": "ints", "strength": "float"},
        extra_ranges={"strength": (0.0, 1.0)},
        # Text-to-video (CogVideoXPipeline) unless the entry names others: ["i2v"]
        # (CogVideoX-5b-I2V, 1.5 I2V: CogVideoXImageToVideoPipeline), ["t2v", "v2v"] (a
        # T2V checkpoint, CogVideoXVideoToVideoPipeline's steps); no flf2v pipeline exists
        # (workers/pipelines/diffusers/cogvideox/adapter.py).
    ),
    "diffusers.ltx2": _diffusers_video(
        "diffusers.ltx2",
        # "lossless" only: its audio branch has its own output projection, which the lite
        # TaylorSeer forecast does not cover (docs/adapters.md, "Cache tiers").
        quality_tiers=[],
        min_size=32,
        size_multiple=32,
        default_size=(768, 512),
        frame_multiple=8,
        default_fps=24,
        default_steps=30,
        has_audio=True,
        # LTX2Pipeline.__call__ arguments of the same names (its defaults apply when absent);
        # stg_blocks: comma-separated transformer block indices ("" turns STG off);
        # image_crf: the keyframes' H.264 re-compression (i2v / flf2v; 0: none).
        extra_params={
            "frame_indices": "ints",
            "image_crf": "int",
            "stg_scale": "float",
            "modality_scale": "float",
            "guidance_rescale": "float",
            "audio_guidance_scale": "float",
            "audio_stg_scale": "float",
            "audio_modality_scale": "float",
            "audio_guidance_rescale": "float",
            "stg_blocks": "str",
            "use_cross_timestep": "bool",
            "motion_speed": "float",
            "decode_timestep": "float",
            "decode_noise_scale": "float",
        },
        extra_ranges={
            "stg_scale": (0.0, 10.0),
            "modality_scale": (0.0, 10.0),
            "guidance_rescale": (0.0, 1.0),
            "audio_guidance_scale": (0.0, 20.0),
            "audio_stg_scale": (0.0, 10.0),
            "audio_modality_scale": (0.0, 10.0),
            "audio_guidance_rescale": (0.0, 1.0),
            "motion_speed": (0.05, 10.0),
            "decode_timestep": (0.0, 1.0),
            "decode_noise_scale": (0.0, 1.0),
            "image_crf": (0, 51),
        },
        # Text-to-video (LTX2Pipeline) unless the entry names more: "i2v" (a first frame:
        # LTX2ImageToVideoPipeline), "flf2v" (first and last: LTX2ConditionPipeline); every
        # LTX-2 checkpoint serves all three (workers/pipelines/diffusers/ltx2/i2v.py).
    ),
    "diffusers.minimax_h3": ModelSpec(
        name="diffusers.minimax_h3",
        # One job: a 24 fps video and its stereo soundtrack (AAC in the MP4). Canvases are
        # multiples of 32 with a side ratio from 1:4 to 4:1; the default is H3's own 16:9.
        min_size=32,
        size_multiple=32,
        max_width=2048,
        max_height=2048,
        default_size=(1344, 768),
        # 17n + 5 frames (the video VAE's chunks), 5 to 15 s after snapping.
        frame_multiple=17,
        frame_offset=5,
        min_frames=120,
        max_frames=360,
        default_fps=24,
        min_fps=24,
        max_fps=24,
        default_seconds=5.0,
        # Sigma points: N gives N - 1 transformer evaluations (vLLM-Omni's convention);
        # evaluations on an entry with the adapter option steps = "evaluations" (FastH3).
        min_steps=2,
        default_steps=31,
        has_audio=True,
        supports_image_input=True,
        parameters=["flow_shift"],
        extra_params={
            "task": "str",
            "frame_indices": "ints",
            "aspect_ratio": "str",
            "audio_flow_shift": "float",
        },
        extra_choices={
            "task": ["t2va", "fl2va", "ref2va"],
            "aspect_ratio": ["21:9", "16:9", "4:3", "1:1", "3:4", "9:16"],
        },
        extra_ranges={"audio_flow_shift": (0.01, 100.0)},
        workflows=["t2va", "fl2va"],
        canvas_short_edge=768,
        canvas_max_pixels=768 * 1344,
        attention={"blocks": "sdpa", "token_refiner": "sdpa"},
    ),
    "diffusers.stable_audio": ModelSpec(
        name="diffusers.stable_audio",
        modality="audio",
        default_steps=100,
        default_seconds=10.0,
        max_seconds=47.55,
        parameters=["guidance_scale", "negative_prompt"],
        # Window of the generated clip in seconds; the adapter's default end is
        # num_frames / fps. 47.55 s is stable-audio-open-1.0's maximum.
        extra_params={"audio_start_in_s": "float", "audio_end_in_s": "float"},
        extra_ranges={"audio_start_in_s": (0.0, 47.55), "audio_end_in_s": (0.0, 47.55)},
    ),
    "diffusers.longcat_audio": ModelSpec(
        name="diffusers.longcat_audio",
        modality="audio",
        description=(
            "LongCat-AudioDiT: text-to-speech by a DiT over audio-VAE latents, conditioned on "
            "UMT5 text embeddings; the clip's length is estimated from the text."
        ),
        text_to_speech=True,  # /v1/audio/speech picks it before any other audio model
        # LongCatAudioDiTPipeline's own: num_inference_steps 16, max_wav_duration 30 s.
        default_steps=16,
        max_steps=100,
        default_seconds=5.0,
        max_seconds=30.0,
        # ``speed`` stretches the estimated duration; ``duration_seconds`` (speech) or
        # ``seconds`` (generations) replaces it. No speaker input: ``voice`` is not read.
        parameters=["guidance_scale", "negative_prompt", "speed", "duration_seconds"],
        # LongCat-AudioDiT is trained on Chinese and English speech: it reads either text.
        spoken_languages=["en", "zh"],
    ),
    "diffusers.helios": ModelSpec(
        name="diffusers.helios",
        description=(
            "Helios: autoregressive video diffusion streamed chunk by chunk over a compressed "
            "history, steered by prompt changes from the next denoise step (no camera control)."
        ),
        streaming=True,  # a world model (workers/pipelines/diffusers/helios/adapter.py)
        camera_control=False,
        # HeliosPipeline checks multiples of 16; 640x384 is its default and published size.
        size_multiple=16,
        default_size=(640, 384),
        # Every chunk is 9 latent frames, decoded on its own to (9 - 1) * 4 + 1 = 33 frames.
        frame_multiple=33,
        frame_offset=33,
        min_frames=33,
        max_frames=33 * 40,  # 40 chunks, 55 s at 24 fps
        default_fps=24,  # Helios's examples export at 24 fps
        default_seconds=132 / 24,  # 4 chunks (132 frames, __call__'s default)
        max_steps=100,
        default_steps=50,  # HeliosPipeline's num_inference_steps, per chunk
        supports_image_input=True,
        parameters=["negative_prompt"],
        # HeliosPipeline.__call__'s (default 5.0; 1.0 runs without CFG, as Distilled does);
        # HeliosPyramidPipeline's steps per stage (default: steps_per_chunk shared evenly).
        extra_params={"guidance_scale": "float", "pyramid_num_inference_steps_list": "ints"},
        extra_ranges={"guidance_scale": (0.0, 20.0)},
        # A prompt change conditions each chunk on one embedding, so 1 chunk is a cut;
        # the default blends over two (half-way, then whole).
        default_transition_chunks=2,
        # The embeddings are an input of every step: a prompt change enters the chunk
        # under way at its next step (pyramid stage or step boundary).
        interaction_at="step",
    ),
}
