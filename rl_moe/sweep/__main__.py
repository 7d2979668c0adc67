"""``python -m rl_moe.sweep``: see :mod:`rl_moe.sweep`."""

import sys

from rl_moe.sweep import main

sys.exit(main())
