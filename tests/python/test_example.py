"""test_example.py : examples/train_gpt.py runs (a few steps, a few decode tokens), so
that it cannot rot. On every device torch has; it checks its own paged-cache decode
against a full forward and exits non-zero when they disagree."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_train_gpt(device):
    script = os.path.join(ROOT, "examples", "train_gpt.py")
    run = subprocess.run([sys.executable, script, "--device", device, "--steps", "3",
                          "--decode", "5", "--batch", "4", "--context", "24"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "step 2: loss" in run.stdout or "training skipped" in run.stdout
    assert "logits(full forward)" in run.stdout
