"""Importing `runtime` bounds libgomp's spin wait before torch loads it, unless the environment already says."""

import os
import subprocess
import sys

from runtime.openmp_env import SPINCOUNT

READ = "import runtime, os, torch; print(os.environ['GOMP_SPINCOUNT'])"


def test_an_offline_script_gets_the_bounded_spin_wait_and_its_own_setting_wins():
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    assert subprocess.run([sys.executable, "-c", READ], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == SPINCOUNT
    assert subprocess.run([sys.executable, "-c", READ], env={**env, "GOMP_SPINCOUNT": "5"}, capture_output=True,
                          text=True, check=True).stdout.strip() == "5"
