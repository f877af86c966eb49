"""The GPU suite: every check that needs a GPU, in one command that fits a lent machine's minutes.

`python -m benchmarks.gpu_suite --out DIR` runs each check (checks.py) in a process of its own, one after
another, each within its time limit and all within the deadline, so a check that fails, hangs or crashes
its process leaves the others their turn. It writes DIR/report.json (the device and versions, then each
check's status, figures and targets), DIR/summary.txt (one line per check) and DIR/suite.log (every
check's output). `--dry-run` runs the same code on the CPU at tiny sizes (Triton under its interpreter),
where figures are not held to the targets: CI runs it, so the GPU path cannot rot unseen.
"""
