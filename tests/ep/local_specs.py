"""The ep family's purely local ops (no process group): what the bad-input campaign can run on them."""

from tests.ep.specs import SPECS as _ALL

SPECS = [s for s in _ALL if s.name == "ep_expand"]
