"""``deep_ep.utils``: what DeepEP's own tests import (``math``, ``envs``, ``testing``, ``event``), with
upstream's names and semantics; ``EventHandle`` is re-exported here as upstream's ``__init__`` does, and
``EventOverlap`` as DeepEP V1 (<= 1.2.1, a ``deep_ep/utils.py`` module) defined it here: Megatron-LM imports
``from deep_ep.utils import EventHandle, EventOverlap`` and takes DeepEP for missing when that import fails."""

from torch_ascend_moe.deep_ep.utils import envs, event, gate, math, refs, semantic, testing  # noqa: I001
from torch_ascend_moe.deep_ep.utils.event import EventHandle, EventOverlap

__all__ = ["EventHandle", "EventOverlap", "envs", "event", "gate", "math", "refs", "semantic", "testing"]
