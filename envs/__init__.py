"""Environments of rl_moe, installed as ``rl_moe.envs`` from the top-level ``envs/`` folder.

Everything that builds and steps environments lives here, below the scheduler: env families
(:mod:`~rl_moe.envs.families`), suite files and their types (:mod:`~rl_moe.envs.suites`,
:mod:`~rl_moe.envs.suite_spec`, ``suites/*.json``), env factories and vector backends
(:mod:`~rl_moe.envs.factories`, :mod:`~rl_moe.envs.envpool_env`), wrappers, the HumanoidBench
adapter, thread choice, and the per-episode stage log. Nothing here imports
:mod:`rl_moe.continual`; a new task family is a family module and a suite file
(docs/contributing.md, "Adding a task family").
"""
