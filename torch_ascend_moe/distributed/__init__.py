"""The distributed layer every expert-parallel op shares, whatever its device. It knows ranks, rows and bytes,
never an op's meaning (the ep family's stages, ``backends/portable/ep``, sit above it). Bottom up:

    capture       whether a CUDA / NPU graph is being captured (then: no host reads, no host-side deadlines)
    groups        a process group's name and the one place a name is resolved
    waits         bounded waits: a timeout or a transport failure, told apart, on every rank
    payload       rows as bytes: view, gather (with -1 padding), place, split; CPU buffers with warm pages
    shared_rows   rows between gloo ranks of one host through /dev/shm regions, and its barriers
    transport     the all-to-all of rows (shared memory, point to point, or all_to_all_single) and flag all-reduces
    agreement     the header every rank gathers before rows move: same op, same shapes, no rank rejected

Each module imports only those above it in this list."""
