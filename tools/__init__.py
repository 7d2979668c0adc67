"""Scripts that build the evidence in results/ from run folders; run from the repository root as
``python -m tools.<name>`` (docs/results.md, docs/reproduce.md). They import the installed
``rl_moe`` package and each other as ``tools.<name>``; tests/test_tools.py covers them."""
