"""`zerokit estimate` / `plan`: one JSON object with --json, exit 2 with one stderr line on bad input."""

import csv
import json
import subprocess
import sys

import pytest

from kit.cli import main
from kit.estimate import estimate, plan
from kit.estimate.checkpoint_size import checkpoint_bytes
from kit.paths import DATA
from kit.schema import Setup


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
    assert data == json.loads(json.dumps(estimate(Setup.model_validate(data["setup"])).to_dict()))
    assert data["per_gpu_bytes"] == sum(data["components"].values())
    assert data["setup"]["batch"] == {
        "micro_batch": 1,
        "grad_accum": 4,
        "train_batch": 32,
        "seq_len": 4096,
        "schedule": [],
        "max_tokens": None,
    }
    # fits: the bytes within each GPU's memory in data/gpus.csv, which must compute in bf16
    assert data["fits"] == {
        name: data["per_gpu_bytes"] <= float(row["memory_gib"]) * 2**30
        and float(row["bf16_dense_tflops"]) > 0
        for name, row in _gpus().items()
    }
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
    ],
)
def test_invalid_input_exits_2_with_one_line(capsys, argv, message):
    code, out, err = run_cli(capsys, "estimate", *argv, "--json")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


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
    # fitting: the rows of the planner's own table for the same search that fit, by the fit rule applied
    # here to its per-GPU bytes: the capacity less the 10 % headroom, and bf16 (no V100)
    setup = Setup.model_validate(data["setup"])
    table = plan.search(setup, train_batch=64).table
    assert data["evaluated"] == len(table) and data["headroom"] == plan.DEFAULT_HEADROOM == 0.1
    bf16 = {name: float(row["bf16_dense_tflops"]) > 0 for name, row in _gpus().items()}
    rule = (table.per_gpu_gib <= table.capacity_gib * 0.9) & table.gpu.map(bf16)
    assert (table.fits == rule).all() and 0 < data["fitting"] == int(rule.sum()) < len(table)
    cheapest = data["setups"]
    assert len(cheapest) == 10 and [r["cost_usd"] for r in cheapest] == sorted(
        r["cost_usd"] for r in cheapest
    )
    assert all(r["fits"] and r["hours"] > 0 for r in cheapest + data["pareto"])
    assert {r["pick"] for r in data["best_per_gpu"]} == {"cheapest", "fastest"}
    assert data["make_it_fit"] == []  # the given setup fits
    assert data["assumptions"] == {
        "efficiency": 0.4,
        "link_efficiency": 0.8,
        "overlap": 0.5,
        "host_memory_gbps": 300,
    }


def test_plan_text_shows_the_front_and_how_to_make_it_fit(capsys):
    code, out, _ = run_cli(
        capsys, "plan", "--model", "llama-2-7b", "--stage", "0", "--micro-batch", "8", "--seq-len", "4096",
        "--gpus", "H100-SXM-80GB,A100-SXM-80GB", "--price", "H100-SXM-80GB=4", "--efficiency", "0.5",
    )  # fmt: skip
    assert code == 0
    assert "Pareto front" in out and "efficiency 0.5" in out and "$" in out
    assert "does not fit; the smallest changes that make it fit" in out and "(global 64 kept)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--price", "H100=3"], "price: unknown GPU 'H100'"),
        (["--price", "cheap"], "price: expected USD or GPU=USD"),
        (["--efficiency", "0"], "efficiency: must be in (0, 1]"),
        (["--network", "wifi"], "network: unknown network 'wifi'"),
        (["--headroom", "1"], "headroom: must be in [0, 1)"),
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
