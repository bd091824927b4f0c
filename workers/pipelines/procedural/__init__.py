"""Procedural scenes and soundtracks: the shared toolkit of the weightless reference models.

``reference/video`` (``reference_video.py``) and ``reference/world`` (``reference_world.py``)
both draw from here; neither imports the other. Nothing here understands language. One
module per piece, all of them re-exported here (``from workers.pipelines import
procedural as proc``):

* :mod:`.scene`: :func:`build_scene` hashes the prompt's words (and the seed) into a
  :class:`Scene`: sky, sun or moon (stars at night), terrain (sea, hills, forest,
  mountains, dunes), a main shape on a motion path and a few small shapes; colour and
  setting words ("red", "sunset", "ocean", "night", ...) pick the palette, the seed varies
  the layout. A ``reference_image`` becomes the background.
* :mod:`.render`: :func:`render` draws frames of a scene with a static, panning or
  zooming camera; :func:`camera_view`, :func:`image_frames`, :func:`background` and
  :func:`draw_shape` are its pieces, for renderers with another camera (reference/world's).
* :mod:`.soundtrack`: :func:`soundtrack` makes stereo music for a scene: chords picked
  from the prompt (minor for dark words), bass, and an arpeggio panned with the main
  shape's position.
* :mod:`.latents`: :func:`encode`, :func:`upsample`, :func:`blur` and :func:`to_uint8`
  are the stand-in latent space (2x average pooling in place of a VAE),
  :func:`euler_step` the sampler step both models take in it, :func:`shifted_sigmas`
  their noise schedule; :func:`chunks` splits work into pieces of a bounded size
  (``RENDER_BUDGET``, ``STEP_BUDGET``).
* :mod:`.device`: :func:`select_device`, the device of a pipeline without weights.

Everything is deterministic: the same inputs give bit-identical outputs (on one machine
and torch thread count).
"""

from workers.pipelines.procedural.device import select_device
from workers.pipelines.procedural.latents import (
    RENDER_BUDGET,
    STEP_BUDGET,
    blur,
    chunks,
    encode,
    euler_step,
    shifted_sigmas,
    to_uint8,
    upsample,
)
from workers.pipelines.procedural.render import (
    background,
    camera_view,
    draw_shape,
    image_frames,
    render,
    shape_path,
)
from workers.pipelines.procedural.scene import Colour, Scene, Shape, build_scene
from workers.pipelines.procedural.soundtrack import SAMPLE_RATE, soundtrack

__all__ = [
    "RENDER_BUDGET",
    "SAMPLE_RATE",
    "STEP_BUDGET",
    "Colour",
    "Scene",
    "Shape",
    "background",
    "blur",
    "build_scene",
    "camera_view",
    "chunks",
    "draw_shape",
    "encode",
    "euler_step",
    "image_frames",
    "render",
    "select_device",
    "shape_path",
    "shifted_sigmas",
    "soundtrack",
    "to_uint8",
    "upsample",
]
