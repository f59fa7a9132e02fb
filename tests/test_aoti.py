"""Every op that can run in an AOTInductor package, all families in one package: exported together, compiled by
``aoti_compile_and_package`` and run in a fresh process that loads only our C++ library (no Python fakes, no
autograd), each op's outputs equal to the exporting process's bit for bit (``harness.check_aoti``).

One package rather than one per family: a package's C++ build has a fixed cost (six compiler runs) that dwarfs the
few lines each op adds, and CI has a time budget. An op that cannot be in a package says why in its spec (its
``<op>-aoti-<device>`` contract entry skips with that reason)."""

from __future__ import annotations

import pytest

from tests._families import family_specs
from torch_ascend_moe.testing.harness import check_aoti, devices

_SPECS = [spec for specs in family_specs().values() for spec in specs if spec.aoti is True]


@pytest.mark.slow
@pytest.mark.parametrize("device", devices())
def test_every_family_in_one_package(device, tmp_path):
    here = [spec for spec in _SPECS if spec.devices is None or device in spec.devices]
    check_aoti(here, device, tmp_path)
