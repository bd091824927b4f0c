"""The client verbs' command lines: ``video`` (alias ``generate``), ``audio``,
``speech``, ``status``, ``list``, ``cancel``, ``download`` and ``models``, each with its
description and every option's default (``cli/help.py``). They run in
``cli/submit.py`` and ``cli/jobs.py``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from cli.client import DEFAULT_URL, KEY_ENV, URL_ENV
from cli.help import command

AUDIO_FORMATS = ("wav", "mp3", "flac", "opus", "aac", "pcm")
QUALITY_TIERS = ("lossless", "high", "fast")
_MODEL = "(default: the model's; see omniqueue models)"


def _client_options() -> argparse.ArgumentParser:
    """--url and --api-key, shared by every client verb."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("server")
    group.add_argument(
        "--url",
        default=None,
        help=f"the API's base URL (default: ${URL_ENV}, else {DEFAULT_URL})",
    )
    group.add_argument(
        "--api-key",
        default=None,
        help=f"API key, sent as a bearer token; not needed while auth is off "
        f"(default: ${KEY_ENV}, else none)",
    )
    return common


def _verb(
    sub: Any,
    common: argparse.ArgumentParser,
    name: str,
    func: Callable[[argparse.Namespace], int],
    **kwargs: Any,
) -> Any:
    """A client verb: :func:`command` with the ``common`` options, run by ``func``."""
    parser = command(sub, name, parents=[common], **kwargs)
    parser.set_defaults(func=func)
    return parser


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"from 1 to 100, not {value}")
    return value


def _output(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="FILE",
        help=f"where to write it; its directory must exist (default: {default})",
    )


def _no_wait(parser: argparse.ArgumentParser, kind: str) -> None:
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help=f"print the {kind}'s id once it is created and exit, without watching or "
        "downloading it (omniqueue status/download ID later)",
    )


def _model(parser: argparse.ArgumentParser, modality: str) -> None:
    parser.add_argument(
        "--model", default=None, help=f"a served {modality} model (default: the server's first)"
    )


def _audio_format(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--format", choices=AUDIO_FORMATS, default=default, help="file format")


def _job_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", help="a job id (video_… or audio_…)")


def _json_lines(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per line")


def _job_options(parser: argparse.ArgumentParser) -> None:
    """What video and audio jobs share."""
    parser.add_argument(
        "--steps", type=int, default=None, help=f"denoise steps (num_inference_steps) {_MODEL}"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="random seed, for a repeatable result "
        "(default: random; the seed used is in omniqueue status)",
    )
    parser.add_argument(
        "--negative-prompt", default=None, help="what to steer away from (default: none)"
    )


def _add_video(sub: Any, common: argparse.ArgumentParser) -> None:
    video = _verb(
        sub,
        common,
        "video",
        _video,
        aliases=["generate"],
        help="generate a video: submit, watch with a progress bar, download",
        description="""Create a video job (POST /v1/videos), watch it with a progress bar
        (stage, denoise step, ETA) and download the MP4. Ctrl-C after the job exists
        cancels it on the server. A refusal of the server (a value the model does not
        take) is one line naming the field. `omniqueue generate` is the same command.

        example:
          omniqueue video "a red ball bouncing at sunset" --seconds 2 --size 480x272 -o ball.mp4""",
    )
    video.add_argument("prompt", help="what the video shows")
    video.add_argument(
        "--image",
        default=None,
        metavar="FILE|URL",
        help="a reference image for the first frame: a PNG, JPEG or WebP file (sent as "
        "multipart input_reference) or an http(s) or data: URL; only models with image "
        "input take it (omniqueue models) (default: none, text to video)",
    )
    video.add_argument("--seconds", default=None, help=f"length in seconds {_MODEL}")
    video.add_argument(
        "--size", default=None, metavar="WxH", help=f"frame size, e.g. 480x272 {_MODEL}"
    )
    _job_options(video)
    video.add_argument(
        "--quality",
        choices=QUALITY_TIERS,
        default=None,
        help="cache tier: high and fast compute fewer denoise steps in full; models list "
        "theirs in omniqueue models (default: the server's, lossless)",
    )
    video.add_argument(
        "--lora",
        default=None,
        metavar="NAME|PATH|JSON",
        help="a LoRA adapter: a name of the server's catalog (omniqueue loras), a path on "
        "the server under OMNIQ_LORA__ROOTS (a relative one is made absolute here) or "
        "s3:// URL, or the whole lora object as JSON (default: none)",
    )
    video.add_argument(
        "--lora-scale", type=float, default=None, help="the adapter's scale (default: 1)"
    )
    video.add_argument(
        "--n",
        type=int,
        default=None,
        metavar="N",
        help="outputs for the prompt (the request's n, up to the model's max_outputs): "
        "saved as <file>, <file stem>-1.mp4, … (default: the server's, 1)",
    )
    _model(video, "video")
    _output(video, "<video id>.mp4 in the current directory")
    _no_wait(video, "video")


def _add_audio(sub: Any, common: argparse.ArgumentParser) -> None:
    audio = _verb(
        sub,
        common,
        "audio",
        _audio,
        help="generate audio (music, sound) from a prompt: submit, watch, download",
        description="""Create an audio job (POST /v1/audio/generations), watch it with a
        progress bar and download the file. Ctrl-C after the job exists cancels it.

        example:
          omniqueue audio "rain and drums at night" --seconds 3 -o rain.wav""",
    )
    audio.add_argument("prompt", help="what the audio sounds like")
    audio.add_argument("--seconds", type=float, default=None, help=f"length in seconds {_MODEL}")
    _job_options(audio)
    _audio_format(audio, "wav")
    audio.add_argument(
        "--sample-rate",
        type=int,
        default=None,
        help="Hz (default: the model's, or the nearest the format takes)",
    )
    audio.add_argument(
        "--channels",
        type=int,
        choices=(1, 2),
        default=None,
        help="1 mono, 2 stereo (default: the model's)",
    )
    _model(audio, "audio")
    _output(audio, "<audio id>.<format> in the current directory")
    _no_wait(audio, "audio job")


def _add_speech(sub: Any, common: argparse.ArgumentParser) -> None:
    speech = _verb(
        sub,
        common,
        "speech",
        _speech,
        help="speak a text (OpenAI text-to-speech) into a file",
        description="""Speak TEXT through POST /v1/audio/speech, OpenAI's text-to-speech
        request: the server answers with the file once the job is done (a spinner
        meanwhile). Ctrl-C closes the connection, and the server cancels the job.

        example:
          omniqueue speech "hello from omniqueue" --voice alloy -o hello.mp3""",
    )
    speech.add_argument("text", help="what to say (the request's input)")
    speech.add_argument("--voice", default=None, help="a voice name (default: the model's)")
    speech.add_argument(
        "--instructions",
        default=None,
        help="how to say it, for models that take it (default: none)",
    )
    speech.add_argument(
        "--speed", type=float, default=None, help="0.25 to 4.0 (default: the server's, 1.0)"
    )
    speech.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="the clip's length (duration_seconds) (default: from the text's word count)",
    )
    _audio_format(speech, "mp3")
    speech.add_argument("--sample-rate", type=int, default=None, help="Hz (default: 24000)")
    speech.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    _model(speech, "audio")
    _output(speech, "<audio id>.<format> in the current directory")


def _add_reads(sub: Any, common: argparse.ArgumentParser) -> None:
    status = _verb(
        sub,
        common,
        "status",
        _status,
        help="show a job's state (progress, stage, error, …)",
        description="""Show a video or audio job's state: status, progress, stage and
        step, queue position and estimated start, settings, times, error. --wait watches
        it to its end with a progress bar (Ctrl-C stops watching; the job goes on).""",
    )
    _job_id(status)
    status.add_argument("--json", action="store_true", help="print the server's JSON object")
    status.add_argument("--wait", action="store_true", help="watch the job until it ends first")

    listing = _verb(
        sub,
        common,
        "list",
        _list,
        help="list your latest jobs, newest first",
        description="""List the latest jobs of the API key (every job while auth is off),
        newest first: id, status, progress, model, creation time and prompt.""",
    )
    listing.add_argument(
        "--kind", choices=("all", "video", "audio"), default="all", help="which jobs"
    )
    listing.add_argument("--limit", type=_limit, default=20, help="how many, 1 to 100")
    _json_lines(listing)

    cancel = _verb(
        sub,
        common,
        "cancel",
        _cancel,
        help="cancel jobs",
        description="""Cancel queued or running jobs. A running job stops at its worker's
        next check (between denoise steps) and leaves nothing stored; a job that ended
        already is left as it is. The job's record stays (omniqueue status ID).""",
    )
    cancel.add_argument("job_ids", nargs="+", metavar="ID", help="job ids (video_… or audio_…)")

    download = _verb(
        sub,
        common,
        "download",
        _download,
        help="download a completed job's file",
        description="""Download what a completed job made: a video's MP4 (or its JPEG
        thumbnail), an audio job's file in its format; with a progress bar.""",
    )
    _job_id(download)
    _output(download, "<id>.mp4, <id>.jpg or <id>.<format> in the current directory")
    download.add_argument("--thumbnail", action="store_true", help="a video's JPEG thumbnail")
    download.add_argument(
        "--index",
        type=int,
        default=0,
        metavar="K",
        help="which output of a video job made with --n, 0 to n - 1",
    )

    models = _verb(
        sub,
        common,
        "models",
        _models,
        help="list the served models and their defaults",
        description="""List the models the server serves (GET /v1/models): modality, which
        command or endpoint uses each, and a job model's defaults (size, seconds, steps)
        and options (--image, --quality tiers, --lora). The first of a modality is the
        default.""",
    )
    _json_lines(models)


def add_parsers(sub: Any) -> None:
    """Every client verb on ``omniqueue``'s subparsers."""
    common = _client_options()
    _add_video(sub, common)
    _add_audio(sub, common)
    _add_speech(sub, common)
    _add_reads(sub, common)


def _server(args: argparse.Namespace) -> dict[str, Any]:
    return {"url": args.url, "api_key": args.api_key}


def _video(args: argparse.Namespace) -> int:
    from cli.submit import run_generate

    return run_generate(
        args.prompt,
        **_server(args),
        seconds=args.seconds,
        size=args.size,
        steps=args.steps,
        seed=args.seed,
        model=args.model,
        negative_prompt=args.negative_prompt,
        quality=args.quality,
        lora=args.lora,
        lora_scale=args.lora_scale,
        n=args.n,
        image=args.image,
        output=args.output,
        wait=not args.no_wait,
    )


def _audio(args: argparse.Namespace) -> int:
    from cli.submit import audio_request, run_job

    request = audio_request(
        args.prompt,
        seconds=args.seconds,
        steps=args.steps,
        seed=args.seed,
        model=args.model,
        negative_prompt=args.negative_prompt,
        response_format=args.format,
        sample_rate=args.sample_rate,
        channels=args.channels,
    )
    return run_job(request, **_server(args), output=args.output, wait=not args.no_wait)


def _speech(args: argparse.Namespace) -> int:
    from cli.submit import run_speech

    return run_speech(
        args.text,
        **_server(args),
        voice=args.voice,
        instructions=args.instructions,
        speed=args.speed,
        seconds=args.seconds,
        response_format=args.format,
        sample_rate=args.sample_rate,
        seed=args.seed,
        model=args.model,
        output=args.output,
    )


def _status(args: argparse.Namespace) -> int:
    from cli.jobs import run_status

    return run_status(args.job_id, **_server(args), as_json=args.json, wait=args.wait)


def _list(args: argparse.Namespace) -> int:
    from cli.jobs import run_list

    return run_list(**_server(args), kind=args.kind, limit=args.limit, as_json=args.json)


def _cancel(args: argparse.Namespace) -> int:
    from cli.jobs import run_cancel

    return run_cancel(args.job_ids, **_server(args))


def _download(args: argparse.Namespace) -> int:
    from cli.jobs import run_download

    return run_download(
        args.job_id,
        **_server(args),
        output=args.output,
        thumbnail=args.thumbnail,
        index=args.index,
    )


def _models(args: argparse.Namespace) -> int:
    from cli.jobs import run_models

    return run_models(**_server(args), as_json=args.json)
