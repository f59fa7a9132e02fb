import sys

from torch_ascend_moe.cli import main

sys.exit(main())
