"""``GET /v1/models`` entries: the limits a client builds its form from."""

from __future__ import annotations

from api.model_list import model_object
from models.catalog import REFERENCE_AUDIO, REFERENCE_VIDEO, REFERENCE_VOICE, REFERENCE_WORLD
from storage.settings import LimitSettings


def test_job_models_list_their_limits_within_the_servers() -> None:
    server = LimitSettings(max_width=640, max_height=1920, max_seconds=8, max_steps=50)
    video = model_object(REFERENCE_VIDEO, server)
    assert (video.kind, video.modality) == ("job", "video")
    assert video.limits is not None
    assert (video.limits.max_width, video.limits.max_height) == (640, 1280)
    assert (video.limits.max_seconds, video.limits.max_steps) == (8, 50)
    assert video.limits.default_size == "832x480" and video.limits.supports_image_input
    assert video.limits.max_outputs == 4  # a create's n
    audio = model_object(REFERENCE_AUDIO, LimitSettings(max_seconds=120))
    assert audio.limits is not None and audio.limits.max_seconds == 60  # the model's own cap


def test_streaming_models_say_which_socket_serves_them() -> None:
    world = model_object(REFERENCE_WORLD, LimitSettings(max_width=320, max_frames=100))
    assert world.kind == "world" and world.limits is not None
    # sessions are capped by the realtime settings, not the job limits
    assert (world.limits.max_width, world.limits.max_frames) == (1280, 957)
    assert (world.limits.frame_offset, world.limits.frame_multiple) == (9, 12)
    assert world.limits.max_seconds is None
    assert world.limits.max_outputs == 1  # a session makes one stream
    assert model_object(REFERENCE_VOICE, LimitSettings()).kind == "voice"


def test_an_audio_model_lists_only_the_limits_of_a_clip() -> None:
    """No size, frames or fps for an audio model (issue 34 §8): its clip's length and
    steps, and the JSON a client reads has no video keys."""
    audio = model_object(REFERENCE_AUDIO, LimitSettings(max_seconds=20, max_steps=50))
    assert audio.limits is not None
    listed = audio.model_dump(mode="json")["limits"]
    assert set(listed) == {
        "default_seconds",
        "max_seconds",
        "min_steps",
        "max_steps",
        "default_steps",
        "supports_image_input",
        "has_audio",
    }
    assert (listed["max_seconds"], listed["max_steps"], listed["has_audio"]) == (20, 50, True)
    voice = model_object(REFERENCE_VOICE, LimitSettings()).model_dump(mode="json")["limits"]
    assert "default_size" not in voice and "max_fps" not in voice
