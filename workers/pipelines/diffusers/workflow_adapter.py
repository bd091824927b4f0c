"""What the adapters of the diffusers video families whose registry entry's
``spec.workflows`` (default ``["t2v"]``) say which of ``t2v``, ``i2v``, ``flf2v`` and
``v2v`` a checkpoint serves (Wan, LTX, LTX-2, CogVideoX) share: the pipeline class those
workflows load, whether a job may send files, the workflows checked against the loaded
components before the entry serves, and a warm-up of its first workflow with grey inputs.
A job's own keyframes or source clip are read by keyframes.py."""

from __future__ import annotations

import abc
from typing import Any

from models.catalog import Workflow
from models.registry import WarmupShape
from workers.pipelines.base import GenerationRequest
from workers.pipelines.diffusers.common import DiffusersAdapter, S
from workers.pipelines.diffusers.keyframes import takes_references, warm_up_inputs


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
