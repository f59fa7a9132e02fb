"""The distributed layer every expert-parallel op shares, whatever its device: ``groups`` (a process group's name
and the one place it is resolved), ``exchange`` (bounded waits, the header exchange, all-to-all of rows),
``shared_rows`` (the rows between ranks of one host through shared memory, under gloo) and ``capture`` (whether a
CUDA or NPU graph is being captured)."""
