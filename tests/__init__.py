"""The test suite, a package: ``tests.<family>.specs`` holds each family's harness specs (``SPECS``), sample
inputs and fp64 references; ``tests.distributed`` the bodies that spawned ranks run; ``tests._families``
finds every family's specs. Run from the repository root (pytest puts it on ``sys.path``)."""
