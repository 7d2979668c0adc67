"""rl_moe: continual RL with Mixture-of-Experts policies, SPHERE and plasticity diagnostics."""

__version__ = "0.1.0"
