"""What the adapters of the diffusers video families whose registry entry's
``spec.workflows`` (default ``["t2v"]``) say which of ``t2v``, ``i2v``, ``flf2v`` and
``v2v`` a checkpoint serves (Wan, LTX, LTX-2, CogVideoX) share: the pipeline class those
workflows load, whether a job may send files, the workflows checked against the loaded
components before the entry serves, and a warm-up of its first workflow with grey inputs.
A job's own keyframes or source clip are read by keyframes.py."""

from __future__ import annotations

import abc
from typing import Any

from models.catalog import ModelSpec, Workflow
from models.registry import WarmupShape
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.shared.common import DiffusersAdapter, S
from workers.pipelines.diffusers.shared.keyframes import takes_references, warm_up_inputs


class WorkflowAdapter(DiffusersAdapter[S]):
    """A ``DiffusersAdapter`` serving its entry's ``workflows``; the family says which
    pipeline class they load (``_pipeline_for``) and what the loaded one must have or
    runs beside it (``_load_workflows``)."""

    def __init__(self, path: str | None = None, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.workflows: list[Workflow] = list(self.spec.workflows or ["t2v"])
        self.pipeline_class = self._pipeline_for(self.workflows)
        self.takes_references = takes_references(self.workflows)

    @staticmethod
    @abc.abstractmethod
    def _pipeline_for(workflows: list[Workflow]) -> Any:
        """The diffusers pipeline class an entry serving ``workflows`` loads."""

    @abc.abstractmethod
    def _load_workflows(self, pipe: Any) -> None:
        """The served workflows checked against the loaded components (``ValueError``
        naming the model on a mismatch), and what they run beside ``pipe`` built."""

    def load(self, device: str) -> None:
        """``DiffusersAdapter.load``, then ``_load_workflows`` (refusing to start on a
        mismatch)."""
        super().load(device)
        self._load_workflows(self._loaded())

    def _warm_up_request(self, shape: WarmupShape) -> GenerationRequest:
        """The warm-up of the entry's first workflow: grey keyframes for an image one, a
        grey clip for v2v."""
        return warm_up_inputs(super()._warm_up_request(shape), self.workflows[0])


class TextOverImage(abc.ABC):
    """Mixed in before ``WorkflowAdapter`` by the families (Wan, LTX) whose image-to-video
    pipeline also serves an entry's ``t2v`` jobs: those run the family's text-to-video
    pipeline over the loaded pipe's modules (``_text_pipe``, built by ``load``)."""

    spec: ModelSpec
    workflows: list[Workflow]
    # The family's image-to-video pipeline class.
    image_pipeline_class: Any = None
    _text_pipe: Any = None

    @staticmethod
    @abc.abstractmethod
    def _check_workflows(name: str, pipe: Any, workflows: list[Workflow]) -> None:
        """The family's check of the served workflows against the loaded components."""

    @staticmethod
    @abc.abstractmethod
    def _text_pipeline(pipe: Any) -> Any:
        """The family's text-to-video pipeline over an image-to-video pipe's modules."""

    def _load_workflows(self, pipe: Any) -> None:
        """``_check_workflows``, and ``_text_pipeline`` over an image-to-video pipe for an
        entry serving ``t2v``."""
        self._check_workflows(self.spec.name, pipe, self.workflows)
        if "t2v" in self.workflows and isinstance(pipe, self.image_pipeline_class):
            self._text_pipe = self._text_pipeline(pipe)
