"""``make lab`` starts JupyterLab through ``kit.lab.server``, as ``make e2e`` (tests/e2e/lab.py) does: on a
machine without a GPU its kernels choose DeepSpeed's CPU accelerator up front instead of being warned."""

import subprocess
import sys

from kit.lab import server


def test_kernels_get_the_cpu_accelerator_without_a_gpu_and_keep_one_named():
    import torch

    env = server.environment({"PATH": "/usr/bin"})
    assert env.get("DS_ACCELERATOR") == (None if torch.cuda.is_available() else "cpu")
    assert server.environment({"DS_ACCELERATOR": "cuda"})["DS_ACCELERATOR"] == "cuda"


def test_the_command_is_this_venvs_jupyter_lab_on_the_folder():
    argv = server.command("notebooks", "--no-browser")
    assert argv[0].startswith(sys.prefix) and argv[1:3] == ["lab", "notebooks"] and argv[-1] == "--no-browser"
    done = subprocess.run([argv[0], "lab", "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.strip()[0].isdigit()  # the jupyter that make lab starts is installed
