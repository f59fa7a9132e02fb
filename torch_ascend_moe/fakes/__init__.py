"""Fake implementations (shapes, dtypes, devices; no data) of every ascend_moe op, one module per family
(``_registry.fake``); each calls its family's signature checks (``checks/<family>.py``) before it allocates.

Each family's schemas name its module in ``set_python_module`` (``csrc/ops/<family>_cpu.cpp``), so tracing
an op before its fakes are imported fails with a hint to import that module.
"""

from torch_ascend_moe._registry import import_families

import_families(__name__, __path__)
