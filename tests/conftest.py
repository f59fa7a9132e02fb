import os

import torch

# Triton kernels (backends/cuda) run on CPU tensors in Triton's interpreter, which must be chosen before triton is
# imported; a machine with a GPU compiles them instead.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Reproducible random inputs; each test that needs a stream makes its own generator too.
torch.manual_seed(0)


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        action="append",
        default=[],
        help="run the op-contract harness on this device (cpu, cuda, npu; repeatable); default: CPU plus every "
        "accelerator present",
    )


def pytest_configure(config):
    # The harness parametrizes by device at collection: it reads the choice from the environment (xdist workers
    # inherit it).
    if config.getoption("--device"):
        os.environ["TORCH_ASCEND_MOE_DEVICES"] = ",".join(config.getoption("--device"))
