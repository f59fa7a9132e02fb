"""The randomized bad-input campaign (torch_ascend_moe.testing.campaign) over every family with op specs
(``tests/<family>/specs.py``, found by tests._families).

Each family runs in a subprocess with a memory cap; the test fails listing every mutated call on which the eager
kernel, the portable kernel and the fake disagree, or that fails with anything but an argument error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests._families import ROOT, family_specs, spec_modules
from torch_ascend_moe.testing import campaign

# ep's communicating ops need a process group (their bad inputs run on one- and multi-rank groups in tests/ep);
# its local ops (ep_expand) run here through tests.ep.local_specs.
MODULES = {f: spec_modules()[f] for f in family_specs() if f != "ep"} | {"ep (local ops)": "tests.ep.local_specs"}


@pytest.mark.parametrize("family", sorted(MODULES))
def test_every_mutation_gets_one_verdict(family):
    # The subprocess imports the family's specs by module name (tests.<family>.specs): the root on sys.path.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    run = subprocess.run(
        [sys.executable, "-m", campaign.__name__, MODULES[family]],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["cases"] > 0
    assert not result["findings"], f"{len(result['findings'])} of {result['cases']} cases:\n" + "\n".join(
        result["findings"][:40]
    )


def test_campaign_catches_a_drifting_message(monkeypatch):
    """The verdict flags a fake whose message differs from the kernel's (the defect class it exists for)."""
    import torch

    from tests.gemm.specs import SPECS

    spec = next(s for s in SPECS if s.name == "bf16_gemm")
    sample = spec.sample_inputs("cpu", torch.float32, small=True)[0]
    bad = list(sample.args)
    bad[1] = bad[1].to(torch.float64)  # b's dtype differs from a's
    assert campaign.verdict(spec, tuple(bad)) is None
    real = spec.portable
    monkeypatch.setattr(spec, "portable", lambda *a: (_ for _ in ()).throw(ValueError("ascend_moe::other: text")))
    assert "portable disagrees" in campaign.verdict(spec, tuple(bad))
    monkeypatch.setattr(spec, "portable", real)
