import torch

# Reproducible random inputs; each test that needs a stream makes its own generator too.
torch.manual_seed(0)
