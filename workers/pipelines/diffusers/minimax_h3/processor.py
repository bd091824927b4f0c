"""MiniMax-H3's Qwen3-VL processor, loaded so that a worker without torchvision still
serves keyframes and image references.

transformers' Qwen3-VL *video* processor needs torchvision; without it the whole
``Qwen3VLProcessor`` fails to load. Such a worker gets :class:`ImageOnlyProcessor`
instead (the same tokenizer and image processor, no video processor): t2va, fl2va and
image/audio references run, and a video reference is refused, naming it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from transformers import AutoImageProcessor, AutoTokenizer, Qwen3VLProcessor

log = logging.getLogger(__name__)


class ImageOnlyProcessor(Qwen3VLProcessor):
    """A Qwen3-VL processor whose video processor may be absent."""

    def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
        if argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)

    def save_pretrained(self, save_directory: Any, push_to_hub: bool = False, **kwargs: Any) -> Any:
        """The tokenizer's and the image processor's files (a full Qwen3-VL processor
        loads them, as does :func:`load_processor`)."""
        os.makedirs(save_directory, exist_ok=True)
        files = list(self.tokenizer.save_pretrained(save_directory))
        files += list(self.image_processor.save_pretrained(save_directory))
        return files


def load_processor(directory: Path) -> Any:
    """The processor saved in ``directory``: the full one where it loads, else
    :class:`ImageOnlyProcessor` (logged once)."""
    try:
        return Qwen3VLProcessor.from_pretrained(str(directory), local_files_only=True)
    except (ImportError, OSError, ValueError, TypeError, AttributeError) as exc:
        reason = " ".join(str(exc).split())[:200]
        log.warning(
            "MiniMax-H3: no Qwen3-VL video processor (%s); video references refused", reason
        )
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    images = AutoImageProcessor.from_pretrained(str(directory), local_files_only=True)
    return ImageOnlyProcessor(image_processor=images, tokenizer=tokenizer)


def takes_video(processor: Any) -> bool:
    return getattr(processor, "video_processor", None) is not None
