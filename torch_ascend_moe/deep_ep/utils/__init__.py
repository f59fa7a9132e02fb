"""``deep_ep.utils``: what DeepEP's own tests import (``math``, ``envs``, ``testing``, ``event``), with
upstream's names and semantics; ``EventHandle`` is re-exported here as upstream's ``__init__`` does."""

from torch_ascend_moe.deep_ep.utils import envs, event, gate, math, refs, semantic, testing  # noqa: I001
from torch_ascend_moe.deep_ep.utils.event import EventHandle

__all__ = ["EventHandle", "envs", "event", "gate", "math", "refs", "semantic", "testing"]
