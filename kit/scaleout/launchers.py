"""The files of the launchers people use, from one Setup: ``zerokit launch-cmd --for LAUNCHER``.

``launcher_files(setup, target, launch)`` is the ``--out`` folder of one launcher, as file name ->
``LaunchFile`` (text, what it is). Every folder has the ``ds_config.json`` its launcher reads and a
``README.md`` naming the command and the Setup that wrote the folder (JSON has no comments; the shell
scripts, the YAML, the hostfile and the Python snippet say it themselves):

- ``deepspeed``: ``launch.sh`` (DeepSpeed's launcher; multi-node: ``hostfile`` and ``.deepspeed_env``);
- ``torchrun``: ``torchrun.sh NODE_RANK``, run once on every node;
- ``slurm``: ``sbatch.sh``, ``srun`` starting one ``torchrun`` per node in that node's environment;
- ``accelerate``: ``accelerate_config.yaml`` (a DeepSpeed plugin naming ``deepspeed_config_file``) and
  ``launch.sh`` (``accelerate launch``), which reach the nodes through DeepSpeed's runner;
- ``hf-trainer``: ``ds_config.json`` in the Trainer's ``"auto"`` style (``hf_trainer_ds_config``) and
  ``launch.sh`` passing the TrainingArguments (``--deepspeed ds_config.json``) that fill it;
- ``lightning``: ``lightning_strategy.py``, the ``DeepSpeedStrategy(config=...)`` snippet and Trainer
  options (Lightning is not a dependency of the kit), and the config Lightning completes.
"""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import dataclass

from kit.ds_config import to_ds_config
from kit.ds_keys import BATCH_KEYS
from kit.rules import DEFAULT_MASTER_PORT
from kit.scaleout import commands, network
from kit.scaleout.hostfile import Host, format_hostfile
from kit.schema import Setup
from kit.settings import ZERO_KEYS, hf_auto

LAUNCHER_FILES = ("deepspeed", "torchrun", "slurm", "accelerate", "hf-trainer", "lightning")
#: the launchers whose multi-node files name the hosts (SLURM's come from the job; Lightning's from its
#: per-node starter)
NEED_HOSTS = ("deepspeed", "torchrun", "accelerate", "hf-trainer")


@dataclass(frozen=True)
class Launch:
    """Where the job starts: the script and its arguments, the hosts (none: one node) and the hostfile
    path the commands name, the master, DeepSpeed's multi-node backend and the network choices."""

    script: str = "train.py"
    script_args: tuple[str, ...] = ()
    hosts: tuple[Host, ...] = ()
    hostfile: str = "hostfile"
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    launcher: str = "pdsh"
    interface: str | None = None
    hca: str | None = None


@dataclass(frozen=True)
class LaunchFile:
    text: str
    about: str
    executable: bool = False


def written_by(setup: Setup, target: str) -> str:
    """The line each file carries: the command that wrote it and the Setup it is for."""
    from kit.run.sweep import config_id

    c, m = setup.cluster, setup.model
    return (
        f"written by `zerokit launch-cmd --for {target}` (zero-kit) for {setup.label} on "
        f"{c.nodes} x {c.gpus_per_node} {c.gpu}, model {m.name} ({m.params:,} parameters), "
        f"config {config_id(setup)}"
    )


def launcher_files(setup: Setup, target: str, launch: Launch) -> dict[str, LaunchFile]:
    """The files of ``target``'s launch folder, by name; ValueError naming ``for`` for an unknown one."""
    if target not in _BUILDERS:
        raise ValueError(f"for: choose one of {', '.join(LAUNCHER_FILES)}, got {target!r}")
    note = written_by(setup, target)
    files = _BUILDERS[target](setup, launch, note)
    files["README.md"] = LaunchFile(
        _readme(setup, target, note, files), "what each file is, and who wrote it"
    )
    return files


def _json(config: dict) -> str:
    return json.dumps(config, indent=2) + "\n"


def _multi_node(setup: Setup, launch: Launch, note: str) -> dict[str, LaunchFile]:
    """``hostfile`` and ``.deepspeed_env`` for a launch through DeepSpeed's runner on several nodes."""
    if setup.cluster.nodes == 1:
        return {}
    return {
        "hostfile": LaunchFile(f"# {note}\n" + format_hostfile(list(launch.hosts)), "DeepSpeed's hostfile"),
        ".deepspeed_env": LaunchFile(
            network.deepspeed_env(setup, launch.interface, launch.hca),
            "the network settings DeepSpeed's runner exports on every node (it reads no comments)",
        ),
    }


def _deepspeed_argv(setup: Setup, launch: Launch, script_args: list[str], **options) -> list[str]:
    return commands.deepspeed_command(
        setup,
        launch.script,
        script_args,
        hostfile=launch.hostfile,
        master_addr=launch.master_addr,
        master_port=launch.master_port,
        launcher=launch.launcher,
        **options,
    )


def _deepspeed(setup: Setup, launch: Launch, note: str) -> dict[str, LaunchFile]:
    argv = _deepspeed_argv(setup, launch, list(launch.script_args))
    return {
        "ds_config.json": LaunchFile(_json(to_ds_config(setup)), "DeepSpeed's config for the setup"),
        "launch.sh": LaunchFile(
            commands.launch_script(argv, (note,)), "DeepSpeed's launcher, run on the first node", True
        ),
        **_multi_node(setup, launch, note),
    }


def _network_exports(setup: Setup, launch: Launch) -> tuple[str, ...]:
    net = network.network(setup, launch.interface, launch.hca)
    return tuple(f"export {k}={shlex.quote(s.value)}  # {s.reason}" for k, s in net.env.items())


def _torchrun(setup: Setup, launch: Launch, note: str) -> dict[str, LaunchFile]:
    nodes = setup.cluster.nodes
    argv = commands.torchrun_command(
        setup,
        launch.script,
        list(launch.script_args),
        master_addr=launch.master_addr,
        master_port=launch.master_port,
        node_rank="$NODE_RANK",
    )
    if nodes == 1:
        first = ["NODE_RANK=0"]
    else:
        hosts = ", ".join(f"{i} on {h.host}" for i, h in enumerate(launch.hosts))
        first = [f'NODE_RANK=${{1:?"give this node\'s rank: {hosts}"}}', *_network_exports(setup, launch)]
    usage = "run ./torchrun.sh NODE_RANK on every node at once" if nodes > 1 else "run ./torchrun.sh"
    return {
        "ds_config.json": LaunchFile(_json(to_ds_config(setup)), "DeepSpeed's config for the setup"),
        "torchrun.sh": LaunchFile(
            commands.launch_script(argv, (note, usage), tuple(first)), "torchrun, once per node", True
        ),
    }


def _slurm(setup: Setup, launch: Launch, note: str) -> dict[str, LaunchFile]:
    sbatch = commands.sbatch_script(
        setup,
        launch.script,
        list(launch.script_args),
        master_port=launch.master_port,
        interface=launch.interface,
        comments=(note,),
    )
    return {
        "ds_config.json": LaunchFile(_json(to_ds_config(setup)), "DeepSpeed's config for the setup"),
        "sbatch.sh": LaunchFile(sbatch, "the SLURM batch script: sbatch sbatch.sh"),
    }


def accelerate_config(setup: Setup, launch: Launch, ds_config: str = "ds_config.json") -> dict:
    """accelerate's config (``ClusterConfig``) for the Setup: DeepSpeed with ``deepspeed_config_file``,
    which holds precision, batch and ZeRO (accelerate refuses them beside it); several nodes reached by
    DeepSpeed's runner (``deepspeed_multinode_launcher``, the hostfile) from machine rank 0."""
    c = setup.cluster
    plugin: dict = {"deepspeed_config_file": ds_config, "zero3_init_flag": setup.zero.stage == 3}
    config: dict = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED"}
    config["deepspeed_config"] = plugin
    config |= {"machine_rank": 0, "num_machines": c.nodes, "num_processes": c.nodes * c.gpus_per_node}
    config |= {"main_process_port": launch.master_port, "rdzv_backend": "static", "use_cpu": False}
    if c.nodes > 1:
        plugin |= {"deepspeed_multinode_launcher": launch.launcher, "deepspeed_hostfile": launch.hostfile}
        config |= {"main_process_ip": launch.master_addr, "same_network": True}
    return config


def _yaml(config: dict, indent: str = "") -> list[str]:
    """Block YAML for a dict of str, int, bool and dicts (what ``yaml.safe_load`` reads back)."""
    lines = []
    for key, value in config.items():
        if isinstance(value, dict):
            lines += [f"{indent}{key}:", *_yaml(value, indent + "  ")]
        else:
            text = str(value).lower() if isinstance(value, bool) else json.dumps(value)
            lines.append(f"{indent}{key}: {text}")
    return lines


def _accelerate(setup: Setup, launch: Launch, note: str) -> dict[str, LaunchFile]:
    yaml_lines = [f"# {note}", *_yaml(accelerate_config(setup, launch))]
    argv = ["accelerate", "launch", "--config_file", "accelerate_config.yaml", launch.script]
    argv += list(launch.script_args)
    where = "on the first node (accelerate starts the others through DeepSpeed's runner)"
    return {
        "ds_config.json": LaunchFile(_json(to_ds_config(setup)), "DeepSpeed's config, the plugin's file"),
        "accelerate_config.yaml": LaunchFile("\n".join(yaml_lines) + "\n", "accelerate's config"),
        "launch.sh": LaunchFile(commands.launch_script(argv, (note,)), f"accelerate launch, {where}", True),
        **_multi_node(setup, launch, note),
    }


def hf_trainer_ds_config(setup: Setup) -> dict:
    """The Setup's ds_config with ``"auto"`` where the HF Trainer fills the value: the batch sizes,
    clipping, the learning rate and the precision switch (from ``hf_trainer_args``), and the buckets
    whose Setup value is the Trainer's own rule for the model's hidden size (``kit.settings.hf_auto``)."""
    config = copy.deepcopy(to_ds_config(setup))
    for key in (*BATCH_KEYS, "gradient_clipping"):
        config[key] = "auto"
    config["optimizer"]["params"]["lr"] = "auto"
    if setup.zero.mixed_precision:
        config[setup.zero.precision]["enabled"] = "auto"
    zero, hidden = config["zero_optimization"], setup.model.hidden
    for k in ZERO_KEYS:
        if k.hf_auto and hidden and k.key in zero and zero[k.key] == hf_auto(k.key, hidden):
            zero[k.key] = "auto"
    return config


def hf_trainer_args(setup: Setup) -> list[str]:
    """The TrainingArguments flags that make the Trainer fill ``hf_trainer_ds_config``'s ``"auto"``
    values with the Setup's (its ``fill_match`` refuses a flag that disagrees with a written value)."""
    config, b = to_ds_config(setup), setup.batch
    args = [
        "--per_device_train_batch_size",
        str(b.micro_batch),
        "--gradient_accumulation_steps",
        str(b.grad_accum),
    ]
    args += ["--learning_rate", str(config["optimizer"]["params"]["lr"])]
    args += ["--max_grad_norm", str(config["gradient_clipping"])]
    if setup.zero.mixed_precision:
        args.append(f"--{setup.zero.precision}")
    return args


def _hf_trainer(setup: Setup, launch: Launch, note: str) -> dict[str, LaunchFile]:
    argv = _deepspeed_argv(
        setup, launch, [*launch.script_args, *hf_trainer_args(setup)], config_flag="--deepspeed"
    )
    return {
        "ds_config.json": LaunchFile(
            _json(hf_trainer_ds_config(setup)), "DeepSpeed's config in the HF Trainer's \"auto\" style"
        ),
        "launch.sh": LaunchFile(
            commands.launch_script(argv, (note, "the script builds TrainingArguments from these flags")),
            "DeepSpeed's launcher with the Trainer's flags, run on the first node",
            True,
        ),
        **_multi_node(setup, launch, note),
    }


def lightning_ds_config(setup: Setup) -> dict:
    """The ds_config for Lightning's ``DeepSpeedStrategy``: without ``gradient_accumulation_steps`` (which
    Lightning refuses there and sets from ``accumulate_grad_batches``) and ``train_batch_size``."""
    config = to_ds_config(setup)
    del config["gradient_accumulation_steps"], config["train_batch_size"]
    return config


_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": "32-true"}


def lightning_snippet(setup: Setup, note: str, ds_config: str = "ds_config.json") -> str:
    """``lightning_strategy.py``: ``DeepSpeedStrategy(config=...)`` on the ds_config beside it and the
    Trainer options of the Setup's cluster; the import guarded, as Lightning is not a kit dependency."""
    c = setup.cluster
    options = {
        "accelerator": "gpu",
        "devices": c.gpus_per_node,
        "num_nodes": c.nodes,
        "precision": _PRECISION[setup.zero.precision],
        "accumulate_grad_batches": setup.batch.grad_accum,
    }
    return "\n".join(
        [
            f"# {note}",
            '"""Lightning\'s DeepSpeedStrategy for this setup:',
            "`Trainer(strategy=strategy(), **TRAINER_OPTIONS)`.",
            "",
            "Lightning is not a dependency of zero-kit: install it (`pip install lightning`)",
            "where you train. Start it per node as Lightning expects (torchrun or srun).",
            '"""',
            "",
            "from pathlib import Path",
            "",
            f"DS_CONFIG = Path(__file__).with_name({ds_config!r})",
            f"TRAINER_OPTIONS = {options!r}",
            "",
            "",
            "def strategy():",
            '    """DeepSpeedStrategy on DS_CONFIG; without Lightning, ImportError saying how to get it."""',
            "    try:",
            "        from lightning.pytorch.strategies import DeepSpeedStrategy",
            "    except ImportError:",
            "        try:",
            "            from pytorch_lightning.strategies import DeepSpeedStrategy",
            "        except ImportError:",
            "            raise ImportError(",
            '                "lightning_strategy.py needs Lightning, which zero-kit does not install: "',
            '                "pip install lightning"',
            "            ) from None",
            "    return DeepSpeedStrategy(config=str(DS_CONFIG))",
            "",
        ]
    )


def _lightning(setup: Setup, launch: Launch, note: str) -> dict[str, LaunchFile]:
    return {
        "ds_config.json": LaunchFile(
            _json(lightning_ds_config(setup)),
            "DeepSpeed's config; Lightning adds gradient_accumulation_steps",
        ),
        "lightning_strategy.py": LaunchFile(
            lightning_snippet(setup, note), "DeepSpeedStrategy and Trainer options"
        ),
    }


def _readme(setup: Setup, target: str, note: str, files: dict[str, LaunchFile]) -> str:
    rows = [f"| `{name}` | {f.about} |" for name, f in files.items()]
    return "\n".join(
        [
            f"# {target} launch files for {setup.label}",
            "",
            note[0].upper() + note[1:] + ".",
            "",
            "| file | what |",
            "|---|---|",
            *rows,
            "",
        ]
    )


_BUILDERS = {
    "deepspeed": _deepspeed,
    "torchrun": _torchrun,
    "slurm": _slurm,
    "accelerate": _accelerate,
    "hf-trainer": _hf_trainer,
    "lightning": _lightning,
}
