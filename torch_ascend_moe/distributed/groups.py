"""Process groups cross the op boundary by name (schemas take ``str group_name``); this is where a group becomes
its name and a name its group, with one error for a name that names nothing."""

from __future__ import annotations

import torch.distributed as dist

from torch_ascend_moe import checks as ck


def group_name_of(group=None) -> str:
    """The name ``torch.distributed`` knows a group by (the default group when None; a name passes through)."""
    if isinstance(group, str):
        return group
    return (group or dist.distributed_c10d._get_default_group()).group_name


def resolve_group(op: str, group_name: str):
    """The process group called ``group_name`` (``torch.distributed`` must be initialized); ``op`` names the
    caller in the error."""
    ck.check_arg(
        dist.is_available() and dist.is_initialized(),
        op,
        "group_name",
        "value",
        "a process group's name (torch.distributed is not initialized)",
        group_name,
    )
    try:
        return dist.distributed_c10d._resolve_process_group(group_name)
    except Exception as e:  # noqa: BLE001  (torch raises various types for unknown names)
        raise ValueError(ck.message(op, "group_name", "value", "the name of a live process group", group_name)) from e


def group_size(op: str, group_name: str | None) -> int:
    """The number of ranks of the group called ``group_name``; 1 without a group (a single-process call)."""
    return 1 if group_name is None else dist.get_world_size(resolve_group(op, group_name))


def checked_size(op: str, signature, args) -> int:
    """The size R of ``args.group_name``'s group (resolved first, with its own error), once ``signature(args, R)``
    (the op's argument checks, ``checks/ep.py``) has passed."""
    r = group_size(op, args.group_name)
    signature(args, r)
    return r
