"""A job object's ``applied_params``: the optional request fields that reached the model.

vLLM-Omni's ComfyUI node and its benchmark clients always send ``guidance_scale``,
``true_cfg_scale``, ``flow_shift`` and the VAE flags, and OpenAI's SDK always sends
``voice``; the API accepts them for every model and keeps only those the model declares
(``ModelSpec.parameters``; ``api/validation.py``, ``api/audio_validation.py``). Any
other field acts, or is refused with a 400 naming it. So a client can tell a field that
was used from one that was accepted and dropped, the job object names the former.

Read from the stored spec (``Job.spec``, a dict: no parse on a status read), so the
answer holds for every row, old ones included: ``options`` holds only declared fields
since the first schema. What a spec alone cannot tell (a ``negative_prompt`` is stored
for every model) is checked against the served model's ``parameters`` when it is known.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any


def applied_params(spec: Mapping[str, Any], parameters: Collection[str] | None) -> list[str]:
    """The request fields of a stored job spec that reached the model, in this order:
    the sampler/speech options (``guidance_scale``, ``flow_shift``, ``vae_use_tiling``,
    ``voice``, ``speed``, ``language``, …), ``negative_prompt``, ``lora``, ``quality``
    (a cache tier other than ``lossless``), then ``extra_params.<key>`` for each checked
    extra. ``parameters``: the served model's declared fields (None: not served now).

    The fields every job uses (``prompt``, size, length, ``num_inference_steps``, ``seed``,
    input references) are not listed: the job object reports what they resolved to.
    """
    options = spec.get("options") or {}
    names = [name for name, value in options.items() if value is not None]
    if spec.get("negative_prompt") and (parameters is None or "negative_prompt" in parameters):
        names.append("negative_prompt")
    if spec.get("lora"):
        names.append("lora")
    if spec.get("quality", "lossless") != "lossless":
        names.append("quality")
    names += [f"extra_params.{key}" for key in spec.get("extra") or {}]
    return names
