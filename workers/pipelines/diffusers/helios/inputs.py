"""What a Helios session starts from (``helios/adapter.py``): its config checked against the
model, the pyramid's steps per stage, the reference image's latents (I2V) and the VAE's
latent statistics, as ``HeliosPipeline.__call__`` and ``HeliosPyramidPipeline.__call__``
(diffusers 0.42) compute them."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from models.catalog import ModelSpec
from models.errors import InvalidJobInput
from models.realtime_video_chunks import ChunkLattice
from workers.pipelines.base import WorldConfig
from workers.pipelines.diffusers.helios.steps import LATENT_FRAMES_PER_CHUNK
from workers.pipelines.world_rules import check_prompt, check_size

# ``__call__``'s I2V noise on the image latents (``add_noise_to_image_latents``).
IMAGE_NOISE_SIGMA = (0.111, 0.135)
FAKE_IMAGE_NOISE_SIGMA = (0.111, 0.135)  # ``video_noise_sigma_min/max``


def check_config(spec: ModelSpec, lattice: ChunkLattice, config: WorldConfig) -> int:
    """Check a session's config against the model; return its number of chunks
    (``num_frames`` rounded down to whole chunks)."""
    check_prompt(config.prompt)
    if config.camera_action_script is not None:
        raise InvalidJobInput(f"camera_action_script: {spec.name} has no camera conditioning")
    check_size(spec, config.width, config.height)
    chunks = lattice.chunks_for_frames(config.num_frames)
    if chunks < 1:
        raise InvalidJobInput(
            f"num_frames must be at least {lattice.first} (one chunk), got {config.num_frames}"
        )
    if not spec.min_steps <= config.steps_per_chunk <= spec.max_steps:
        raise InvalidJobInput(
            f"steps_per_chunk must be in [{spec.min_steps}, {spec.max_steps}], "
            f"got {config.steps_per_chunk}"
        )
    img, shape = config.reference_image, (config.height, config.width, 3)
    if img is not None and (img.dtype != np.uint8 or img.shape != shape):
        raise InvalidJobInput(f"reference_image must be uint8 {shape}, got {img.dtype} {img.shape}")
    return chunks


def image_latents(
    pipe: Any, config: WorldConfig, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``__call__``'s step 4 for ``image=``: the image and a still video of it encoded,
    then noised (``add_noise_to_image_latents``)."""
    device = pipe._execution_device
    assert config.reference_image is not None
    image = pipe.video_processor.preprocess(
        Image.fromarray(config.reference_image), height=config.height, width=config.width
    )
    mean, inv_std = latent_stats(pipe.vae, device)
    latents, fake = pipe.prepare_image_latents(
        image,
        latents_mean=mean,
        latents_std=inv_std,
        num_latent_frames_per_chunk=LATENT_FRAMES_PER_CHUNK,
        dtype=torch.float32,
        device=device,
        generator=generator,
    )
    lo, hi = IMAGE_NOISE_SIGMA
    sigma = torch.rand(1, device=device, generator=generator) * (hi - lo) + lo
    noise = randn_tensor(latents.shape, generator=generator, device=device)
    latents = sigma * noise + (1 - sigma) * latents
    lo, hi = FAKE_IMAGE_NOISE_SIGMA
    sigma = torch.rand(1, device=device, generator=generator) * (hi - lo) + lo
    noise = randn_tensor(fake.shape, generator=generator, device=device)
    return latents, sigma * noise + (1 - sigma) * fake


def pyramid_steps(pipe: Any, config: WorldConfig) -> list[int]:
    """``pyramid_num_inference_steps_list``: from ``extra``, else ``steps_per_chunk``
    shared evenly by the scheduler's stages (3 steps: [1, 1, 1])."""
    stages = int(pipe.scheduler.config.stages)
    given = config.extra.get("pyramid_num_inference_steps_list")
    if given is None:
        if config.steps_per_chunk % stages:
            raise InvalidJobInput(
                f"steps_per_chunk must be a multiple of {stages} (one share per pyramid "
                f"stage), got {config.steps_per_chunk}"
            )
        return [config.steps_per_chunk // stages] * stages
    if (
        not isinstance(given, list | tuple)
        or len(given) != stages
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in given)
    ):
        raise InvalidJobInput(
            f"pyramid_num_inference_steps_list must be {stages} integers >= 1, got {given!r}"
        )
    return list(given)


def latent_stats(vae: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``latents_mean`` and ``1 / latents_std`` of the VAE, shaped as ``__call__`` makes
    them (its ``latents_std`` is the inverse)."""
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(device, vae.dtype)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(device, vae.dtype)
    return mean, inv_std
