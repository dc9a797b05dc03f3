"""`zerokit estimate` / `plan`: one JSON object with --json, exit 2 with one stderr line on bad input."""

import csv
import dataclasses
import json
import re
import subprocess
import sys

import pytest

from kit.cli import main
from kit.estimate import estimate
from kit.estimate.checkpoint_size import checkpoint_bytes
from kit.gpus import gpu
from kit.paths import DATA
from kit.planning import plan
from kit.schema import Setup
from kit.steptime import perf


def _gpus() -> dict[str, dict]:
    """data/gpus.csv's rows by name, read here (not through kit.gpus)."""
    with open(DATA / "gpus.csv", newline="") as f:
        return {row["name"]: row for row in csv.DictReader(f)}


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_json_contract(capsys):
    code, out, err = run_cli(
        capsys, "estimate", "--model", "llama-2-7b", "--stage", "3", "--gpus-per-node", "8",
        "--micro-batch", "1", "--grad-accum", "4", "--seq-len", "4096", "--json",
    )  # fmt: skip
    assert code == 0 and err == ""
    data = json.loads(out)
    psi, dp = 6_738_415_616, 8  # Llama-2-7B's parameters, over 8 data-parallel ranks
    norms = 2 * 32 + 1  # its RMSNorm weights (4,096 each): below the persistence threshold, kept whole
    assert (data["params"], data["largest_layer_params"]) == (psi, 32_000 * 4096)  # the embedding is largest
    assert data["components"] == {
        "parameters": 2 * (psi // dp + norms * 4096),  # bf16 partition + the norms whole
        "gradients": 2 * psi // dp,  # bf16, partitioned
        "optimizer_states": 12 * psi // dp,  # fp32 master weights + Adam's 2 moments, partitioned
        "activations": data["components"]["activations"],
        "buffers": data["components"]["buffers"],
        "overhead": data["components"]["overhead"],
    }
    assert data["model_states_bytes"] == 16 * psi // dp + 2 * norms * 4096
    # 8 ranks x (2 GiB process + zero.Init's construction of the largest layer in fp32)
    assert data["cpu_bytes_per_node"] == 8 * (2 * 2**30 + 4 * 32_000 * 4096)
    assert data["nvme_bytes_per_node"] == 0 and set(data["host_bytes_per_rank"].values()) == {0}
    timed = data.pop("step_time")  # no calibration: the datasheet's step time, its parts and formulas
    assert timed == json.loads(json.dumps(perf.step_time(Setup.model_validate(data["setup"])).to_dict()))
    assert timed["calibration"] == "uncalibrated" and timed["parts"]["compute"]["formula"]
    assert data == json.loads(json.dumps(estimate(Setup.model_validate(data["setup"])).to_dict()))
    assert data["components_bytes"] == sum(data["components"].values())
    # the verdict's number is the predicted peak per GPU: max reserved (the peak phase's tensors and the
    # allocator's replayed share) + the GPU's overheads; the plan screens on the tensors + the overheads
    overhead = estimate(Setup.model_validate(data["setup"])).peak_overhead.bytes
    assert data["per_gpu_bytes"] == data["peak_per_gpu_bytes"] == data["reserved_bytes"] + overhead
    assert data["screen_bytes"] == max(data["phases"].values()) + overhead < data["per_gpu_bytes"]
    assert data["setup"]["batch"] == {
        "micro_batch": 1,
        "grad_accum": 4,
        "train_batch": 32,
        "seq_len": 4096,
        "schedule": [],
        "max_tokens": None,
        "target_len": None,
    }
    # fits: the bytes within each GPU's memory in data/gpus.csv (past it, the allocator's replay within the
    # memory decides: the L40S's 44.4 GiB hold it by flushing the cache), which must compute in bf16
    est = estimate(Setup.model_validate(data["setup"]))
    assert data["fits"] == {
        name: float(row["bf16_dense_tflops"]) > 0
        and (
            data["per_gpu_bytes"] <= float(row["memory_gib"]) * 2**30
            or est.reserved.flushed(int(float(row["memory_gib"]) * 2**30) - est.peak_overhead.bytes)
            is not None
        )
        for name, row in _gpus().items()
    }
    assert data["fits"]["L40S"] and data["per_gpu_bytes"] > gpu("L40S").memory_bytes
    assert data["fits"]["H100-SXM-80GB"] and not data["fits"]["A100-SXM-40GB"]
    setup = Setup.model_validate(data["setup"])
    assert data["checkpoint_bytes"] == checkpoint_bytes(setup)["total_bytes"]


def test_estimate_params_and_paper_formula(capsys):
    code, out, _ = run_cli(
        capsys,
        "estimate",
        "--params",
        "7.5B",
        "--stage",
        "3",
        "--nodes",
        "8",
        "--formula",
        "zero-paper",
        "--json",
    )
    assert code == 0
    assert json.loads(out)["model_states_bytes"] == 16 * 7_500_000_000 // 64


def test_estimate_table_shows_formulas(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--model", "gpt2", "--stage", "2")
    assert code == 0
    assert "optimizer_states" in out and "B x P" in out and "fits:" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "gpt5"], "model: 'gpt5' is neither a preset"),
        (
            ["--model", "gpt2", "--stage", "2", "--offload-param", "cpu"],
            "zero.offload_param: needs ZeRO stage 3",
        ),
        (["--model", "gpt2", "--train-batch", "100", "--micro-batch", "3"], "100 != 3 * 4 * 8"),
        (["--model", "gpt2", "--gpu", "TPU"], "cluster.gpu: unknown GPU 'TPU'"),
        ([], "model: give --model PRESET|config.json|my_model.py or --params N"),
        (["--model", "gpt2", "--seq-len", "0"], "seq_len: must be a whole number in [1, 1,048,576], got 0"),
        (["--model", "gpt2", "--seq-len", "-8"], "seq_len: must be a whole number in [1, 1,048,576], got -8"),
    ],
)
def test_invalid_input_exits_2_with_one_line(capsys, argv, message):
    code, out, err = run_cli(capsys, "estimate", *argv, "--json")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_a_reader_that_stops_reading_ends_the_output_quietly():
    """``zerokit estimate --json | head -c 0``: the pipe closed before anything is written; the command
    stops with 141 (128 + SIGPIPE, as cat) and no traceback."""
    argv = [sys.executable, "-m", "kit", "estimate", "--model", "gpt2", "--json"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        child.stdout.close()  # before the interpreter has even started
        err = child.stderr.read().decode()
    assert child.returncode == 141 and err == "", err


def test_plan_lists_smallest_cluster_and_batches(capsys):
    code, out, _ = run_cli(
        capsys, "plan", "--model", "llama-2-7b", "--gpu", "A100-SXM-80GB", "--micro-batch", "1",
        "--train-batch", "64", "--seq-len", "2048", "--json",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert [b["micro_batch"] for b in data["batch_options"]] == [8, 4, 2, 1]
    stage3 = next(r for r in data["smallest_cluster"] if r["variant"].startswith("z3 bf16"))
    assert stage3["gpus"] == 2  # one A100-80GB is too small for ZeRO-3 without offload; two suffice
    assert data["train_batch"] == 64 and data["evaluated"] > 1000
    # fitting: the rows of the planner's own table for the same search that pass its screen, the fit rule
    # applied here to its per-GPU bytes (the capacity less the 10 % headroom, and bf16: no V100), less
    # those the allocator's replay refused among the rows the plan named (confirmed, each replayed here)
    setup = Setup.model_validate(data["setup"])
    table = plan.search(setup, train_batch=64).table
    assert data["evaluated"] == len(table) and data["headroom"] == plan.DEFAULT_HEADROOM == 0.1
    bf16 = {name: float(row["bf16_dense_tflops"]) > 0 for name, row in _gpus().items()}
    rule = (table.per_gpu_gib <= table.capacity_gib * 0.9) & table.gpu.map(bf16)
    assert (table.fits == rule).all() and not table.confirmed.any()
    assert data["fitting"] == int(rule.sum()) - data["refused"] < len(table)
    assert 0 <= data["refused"] <= data["confirmed"]
    assert all(r["confirmed"] for r in data["setups"] + data["pareto"] + data["best_per_gpu"])
    cheapest = data["setups"]
    assert len(cheapest) == 10 and [r["cost_usd"] for r in cheapest] == sorted(
        r["cost_usd"] for r in cheapest
    )
    assert all(r["fits"] and r["hours"] > 0 for r in cheapest + data["pareto"])
    assert {r["pick"] for r in data["best_per_gpu"]} == {"cheapest", "fastest"}
    assert data["make_it_fit"] == []  # the given setup fits
    assert data["assumptions"] == dataclasses.asdict(perf.Assumptions())  # the datasheet model's defaults


def test_plan_text_shows_the_front_and_how_to_make_it_fit(capsys):
    argv = ["plan", "--model", "llama-2-7b", "--stage", "0", "--micro-batch", "8", "--seq-len", "4096",
            "--gpus", "H100-SXM-80GB,A100-SXM-80GB", "--price", "H100-SXM-80GB=4",
            "--efficiency", "0.5"]  # fmt: skip
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0 and "efficiency 0.5" in out and "$" in out and len(out.splitlines()) <= 40
    # micro batch 8 alone: grad accum makes the plan's global batch, 1024, and make-it-fit keeps it
    assert "Your setting, z0 bf16 mb8 gas16 on 1x8 H100-SXM-80GB: does not fit (" in out
    assert "the smallest changes that make it fit" in out and "(global 1024 kept)" in out
    assert "Pareto front, wall-clock" not in out and "(2 more with --all)" in out  # 5 of 7 shown
    code, every, _ = run_cli(capsys, *argv, "--all")
    for title in ("Pareto front, wall-clock time vs cost", "Cheapest and fastest per GPU type",
                  "Cheapest fitting setups", "NVMe offload", "Smallest cluster of H100-SXM-80GB",
                  "Decompositions of train_batch 1,024 on 8 GPUs"):  # fmt: skip
        assert title in every
    # a variant that fits nowhere is one clean line; a decomposition too big says so
    assert "z0 bf16 mb8 gas16: does not fit on 512 GPUs" in every
    assert "<NA>" not in every and "None" not in every and "nan" not in every
    big = next(line for line in every.splitlines() if line.split()[:2] == ["8", "16"])
    assert big.endswith("does not fit") and "GiB" in big
    # one row per GPU type where its cheapest setup is also its fastest: none here
    for pick in ("cheapest", "fastest"):
        assert len(re.findall(rf"^{pick} +(!|) +H100-SXM-80GB", every, flags=re.M)) == 1
    assert re.search(r"^cheapest +! A100-SXM-80GB 2x8 z3 hpz8 qwz qgz", every, flags=re.M)  # flagged
    assert every.rstrip().endswith("DeepSpeed implements them for CUDA only")  # what "!" means


ISSUE_24 = ["plan", "--model", "llama-2-7b", "--seq-len", "4096", "--train-batch", "1024", "--tokens",
            "2T", "--price", "H100-SXM-80GB=4.5", "--max-hours", "240"]  # fmt: skip


@pytest.fixture(scope="module")
def issue_plan():
    """The plan of issue 24, as text, as JSON and as ``plan.search``'s own table."""
    import contextlib
    import io

    texts = []
    for extra in ([], ["--json"], ["--all"]):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            assert main([*ISSUE_24, *extra]) == 0
        texts.append(buffer.getvalue())
    data = json.loads(texts[1])
    found = plan.search(
        Setup.model_validate(data["setup"]), train_batch=1024, tokens=2e12, price={"H100-SXM-80GB": 4.5}
    )
    return texts[0], data, texts[2], found


def test_plan_answers_first_on_one_screen(issue_plan):
    out, data, _, _ = issue_plan
    lines = out.splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) < 200
    assert (
        "Book (the cheapest DeepSpeed setup with exact numerics within 240 h): "
        "256 x MI300X (32 nodes x 8), ZeRO-3 + hpZ8, micro batch 4 x grad accum 1" in out
    )
    assert any(
        line.startswith("ds_config: zerokit launch-cmd --model llama-2-7b --nodes 32") for line in lines
    )
    # no setting was given: no invented one, no make-it-fit, no decompositions
    assert "Your setting" not in out and "smallest changes" not in out and "Decompositions" not in out
    assert data["setting_given"] is False and data["make_it_fit"] == [] and data["batch_options"] == []
    # every number formatted: no raw floats such as 6.649728, no missing-value markers
    assert not re.search(r"\d\.\d{4,}", out) and "<NA>" not in out and "None" not in out
    alternatives = lines[
        lines.index("Alternatives (cheapest first; why each differs from the booking):") + 2 :
    ]
    rows = [line for line in alternatives if line.startswith(("  ", "! MI", "! H"))]
    assert 1 <= len(rows) <= 5
    assert "2x the GPUs" in out or "1/2 the GPUs" in out
    assert re.search(r"\d+ % (faster|slower)", out) and re.search(r"\d+ % (cheaper|dearer)", out)


def test_plan_flags_what_changes_the_numerics(issue_plan):
    out, data, _, found = issue_plan
    rec = data["recommended"]
    assert "qwz" not in rec["zeropp"] and "qgz" not in rec["zeropp"] and rec["numerics"] == ""
    fitting = found.fitting(
        240
    )  # a cheaper fitting setup within 240 h quantizes: offered, flagged, not booked
    quantized = fitting[fitting.zeropp.str.contains("qwz qgz")].iloc[0]
    assert quantized.cost_usd < rec["cost_usd"]
    flagged = [a for a in data["alternatives"] if "qwz" in a["zeropp"]]
    assert len(flagged) == 1 and flagged[0]["label"] == quantized.label
    assert "int8 weights" in flagged[0]["numerics"] and "CUDA only, not on MI300X" in flagged[0]["numerics"]
    assert "changes numerics (!)" in flagged[0]["why"]
    assert f"! {flagged[0]['label']}" in out and "! qwZ all-gathers int8 weights" in out


def test_plan_filters_apply_to_every_table(issue_plan):
    _, data, every, found = issue_plan
    rows = data["setups"] + data["pareto"] + data["best_per_gpu"] + data["nvme_slowdown"]
    rows += [data["recommended"], *data["alternatives"]]
    assert all(r["hours"] <= 240 and r["fits"] for r in rows) and data["pareto"] and data["best_per_gpu"]
    assert data["fitting"] == len(found.fitting(240)) and data["max_hours"] == 240
    # the recommendation is the cheapest within 240 h of what DeepSpeed runs without quantizing
    mine = found.fitting(240)
    mine = mine[(mine.engine == "deepspeed") & ~mine.zeropp.str.contains("q")]
    assert data["recommended"]["label"] == mine.iloc[0].label
    hours = [float(h.replace(",", "")) for h in re.findall(r"([\d,]+\.\d) h\b", every)]
    assert hours and max(hours) <= 240  # --all: no table lists a setup past the limit


def test_plan_fastest_within_a_budget(capsys):
    argv = [*ISSUE_24[:-2], "--goal", "fastest", "--budget", "300000", "--max-nodes", "32", "--json"]
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    data = json.loads(out)
    rec = data["recommended"]
    assert rec["cost_usd"] <= 300_000 and data["goal"] == "fastest"
    table = plan.search(
        Setup.model_validate(data["setup"]), train_batch=1024, max_nodes=32, tokens=2e12,
        price={"H100-SXM-80GB": 4.5},
    ).fitting(budget=300_000)  # fmt: skip
    exact = table[(table.engine == "deepspeed") & ~table.zeropp.str.contains("q")]
    assert rec["hours"] == exact.hours.min()
    assert all(r["cost_usd"] <= 300_000 for r in data["pareto"] + data["alternatives"])
    assert [a["hours"] for a in data["alternatives"]] == sorted(a["hours"] for a in data["alternatives"])


def test_plan_ds_config_command_builds_the_recommended_setup(issue_plan):
    from kit.cli import build_parser
    from kit.cli.args import setup_from_args

    _, data, _, found = issue_plan
    command = data["recommended"]["ds_config_command"]
    assert command[:2] == ["zerokit", "launch-cmd"] and command[-2:] == ["--out", "launch"]
    built = setup_from_args(build_parser().parse_args(command[1:]))
    i = found.table.index[found.table.label == data["recommended"]["label"]][0]
    assert built.model_dump() == found.setup(i).model_dump()


def test_plan_ds_config_command_carries_offload_nvme_and_zeropp(capsys):
    from kit.cli import build_parser
    from kit.cli.args import setup_from_args
    from kit.cli.plan import _ds_config_command

    args = build_parser().parse_args(["plan", "--model", "llama-2-7b", "--layers", "8"])
    found = plan.search(setup_from_args(args), train_batch=64, gpus=["H100-SXM-80GB"], max_nodes=2)
    t = found.table
    for i in [t.index[t.offload_param == "nvme"][0], t.index[t.zeropp == "hpz8 qwz qgz"][0],
              t.index[(t.offload_optimizer == "cpu") & t.checkpointing][0]]:  # fmt: skip
        command = _ds_config_command(args, found.setup(i))
        assert "--layers" in command
        built = setup_from_args(build_parser().parse_args(command[1:]))
        assert built.model_dump() == found.setup(i).model_dump(), command


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--price", "H100=3"], "price: unknown GPU 'H100'"),
        (["--price", "cheap"], "price: expected USD or GPU=USD"),
        (["--efficiency", "0"], "efficiency: must be in (0, 1]"),
        (["--network", "wifi"], "network: unknown network 'wifi'"),
        (["--headroom", "1"], "headroom: must be in [0, 1)"),
        (["--budget", "0"], "budget: must be > 0 USD, got 0"),
        (["--max-hours", "-1"], "max-hours: must be > 0 hours, got -1"),
        (["--micro-batch", "3"], "train-batch: 1024 (the plan's default) is not a multiple of micro batch 3"),
        (
            ["--gpus", "V100-SXM2-16GB"],
            "gpus: none of them can be planned for (V100-SXM2-16GB: no bf16 support)",
        ),
    ],
)
def test_plan_bad_search_input_exits_2_with_one_line(capsys, argv, message):
    code, out, err = run_cli(capsys, "plan", "--model", "llama-2-7b", *argv, "--json")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_each_command_parses_with_only_its_own_group():
    """``kit.cli.COMMANDS`` names every command's group (main registers only that group)."""
    from kit.cli import COMMANDS, build_parser

    every = build_parser()._subparsers._group_actions[0].choices
    assert set(every) == set(COMMANDS)
    for command in COMMANDS:
        assert set(build_parser(command)._subparsers._group_actions[0].choices) >= {command}


def test_module_entry_point_answers_without_torch():
    code = (
        "import sys, runpy; sys.argv = ['zerokit', 'estimate', '--model', 'gpt2', '--json'];"
        "import kit.cli as c; rc = c.main(sys.argv[1:]); assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["params"] == 124_439_808


def test_ds_config_auto_values_are_resolved_and_explained_on_stderr(capsys, tmp_path):
    config = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
    }
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    code, out, err = run_cli(
        capsys, "estimate", "--model", "mistral-7b", "--ds-config", str(path), "--micro-batch", "2",
        "--grad-accum", "4", "--seq-len", "4096", "--json",
    )  # fmt: skip
    assert code == 0
    setup = json.loads(out)["setup"]
    assert setup["zero"]["reduce_bucket_size"] == 4096**2 and setup["batch"]["train_batch"] == 64
    assert "reduce_bucket_size: 'auto' -> hidden^2 = 16,777,216 (hidden 4096)" in err


def test_flags_beside_a_ds_config_combine_as_the_hf_trainer_combines_them(capsys, tmp_path):
    """Issue 41, item 6: gradient checkpointing is the Trainer's argument, not a ds_config key, so
    ``--activation-checkpointing`` applies beside the file; a ZeRO flag that says otherwise than the file is
    one line naming both (exit 2), one that agrees is accepted."""
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": True},
    }
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    base = ("estimate", "--model", "llama-2-7b", "--gpus-per-node", "8", "--ds-config", str(path), "--json")
    code, out, _ = run_cli(capsys, *base)
    plain = json.loads(out)
    code, out, _ = run_cli(capsys, *base, "--activation-checkpointing")
    ckpt = json.loads(out)
    assert code == 0 and ckpt["setup"]["zero"]["activation_checkpointing"] is True
    assert ckpt["setup"] == {
        **plain["setup"],
        "zero": {**plain["setup"]["zero"], "activation_checkpointing": True},
    }
    assert ckpt["components"]["activations"] < plain["components"]["activations"]
    assert run_cli(capsys, *base, "--stage", "3")[0] == 0  # agrees with the file
    for flags, line in (
        (("--stage", "2"), "--stage 2: the ds_config's zero_optimization.stage is 3"),
        (("--offload-optimizer", "cpu"), "--offload-optimizer cpu: the ds_config's "
         "zero_optimization.offload_optimizer.device is none"),
        (("--hpz", "8"), "--hpz 8: the ds_config's zero_optimization.zero_hpz_partition_size is 1"),
        (("--prefetch-bucket-size", "2e7"), "--prefetch-bucket-size 20000000: the ds_config's "
         "zero_optimization.stage3_prefetch_bucket_size is 50000000"),
    ):  # fmt: skip
        code, out, err = run_cli(capsys, *base, *flags)
        assert (code, out) == (2, "") and err.count("zerokit estimate:") == 1  # one line, after the notes
        assert err.splitlines()[-1] == f"zerokit estimate: {line}; drop the flag or change the file"


def test_the_fits_line_says_a_gpu_lacks_the_precision_as_the_memory_panel_does(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--model", "gpt2", "--precision", "bf16")
    fits = next(line for line in out.splitlines() if line.startswith("fits: "))
    assert code == 0 and "V100-SXM2-32GB no (no bf16)" in fits and "H100-SXM-80GB yes" in fits
    code, out, _ = run_cli(capsys, "estimate", "--model", "gpt2", "--precision", "fp16")
    assert "V100-SXM2-32GB yes" in out


def test_bucket_flags_set_each_zero_optimization_knob_and_travel_to_launch_cmd(capsys):
    """Issue 40: the bucket and stage-3 fetching knobs the panels offer are flags too, one per
    ``kit.settings.ZERO_KEYS`` entry counted in elements, and ``plan``'s launch-cmd line repeats them."""
    from kit.cli import build_parser
    from kit.cli.args import setup_from_args
    from kit.cli.plan import _ds_config_command
    from kit.settings import BUCKETS, SETTINGS

    BUCKET_KEYS = [s for s in SETTINGS if s.section == BUCKETS]  # the counts in elements

    base = ("estimate", "--model", "llama-2-7b", "--stage", "3", "--json")
    flags = [(f"--{k.field.replace('_', '-')}", k.default + 1) for k in BUCKET_KEYS]
    assert {f for f, _ in flags} >= {
        "--reduce-bucket-size",
        "--prefetch-bucket-size",
        "--max-live-parameters",
    }
    code, out, _ = run_cli(capsys, *base, *(x for f, v in flags for x in (f, str(v))))
    zero = json.loads(out)["setup"]["zero"]
    assert code == 0 and {k.field: zero[k.field] for k in BUCKET_KEYS} == {
        k.field: k.default + 1 for k in BUCKET_KEYS
    }
    with pytest.raises(SystemExit, match="2"):  # argparse's one line names the flag and the forms
        run_cli(capsys, *base, "--reduce-bucket-size", "lots")
    assert "--reduce-bucket-size: not a count: 'lots' (try 7e9, 7B or 350M)" in capsys.readouterr().err
    # plan's launch-cmd line rebuilds the very setup, buckets and checkpointing policy included
    argv = ["plan", "--model", "llama-2-7b", "--layers", "8", "--stage", "3", "--reduce-bucket-size", "2e7"]
    args = build_parser().parse_args(
        [*argv, "--prefetch-bucket-size", "3e7", "--checkpoint-policy", "selective-op"]
    )
    found = plan.search(setup_from_args(args), train_batch=64, gpus=["H100-SXM-80GB"], max_nodes=1)
    t = found.table
    i = t.index[t.checkpointing & (t.engine == "deepspeed") & (t.stage == 3)][0]
    command = _ds_config_command(args, found.setup(i))
    assert {"--reduce-bucket-size", "--prefetch-bucket-size", "--checkpoint-policy"} <= set(command)
    built = setup_from_args(build_parser().parse_args(command[1:]))
    assert built.model_dump() == found.setup(i).model_dump(), command


def test_what_initialize_holds_is_shown_where_it_beats_every_step(capsys):
    """ZeRO-2 flattens the 16-bit module beside its tensors at initialize where the card has room: on an
    H100 the 10B GPT-2 of A23 holds 38.29 GiB then (as an H100 measured, data/reference/allocator-traces),
    more than any step; on a V100-32GB DeepSpeed flattens it through the host and the line is left out."""
    from kit.paths import DATA

    argv = [
        "estimate", "--model", str(DATA / "published" / "models" / "megatron-gpt2-10b.json"), "--nodes", "2",
        "--gpus-per-node", "16", "--stage", "2", "--precision", "fp16", "--micro-batch", "1",
        "--seq-len", "1024", "--activation-checkpointing",
    ]  # fmt: skip
    code, out, _ = run_cli(capsys, *argv, "--gpu", "H100-SXM-80GB")
    line = next(line for line in out.splitlines() if line.startswith("at initialize"))
    assert code == 0 and line.split()[2] == "38.29" and "max_memory_allocated since the start" in line
    code, out, _ = run_cli(capsys, *argv, "--gpu", "V100-SXM2-32GB")
    assert code == 0 and "at initialize" not in out
