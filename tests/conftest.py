"""Test setup: one thread per process (SB3 tests slow down ~100x when two processes fight over cores).

No test renders, so MUJOCO_GL is left as the machine has it (EGL fails on some GPU machines).
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
