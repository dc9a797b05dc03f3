"""GPUs and fabrics given by their figures (kit.gpus.define_gpu / define_network, the CLI's --define-gpu /
--define-network) and plans at any node count (--node-counts)."""

import json
import re

import pytest

from kit import gpus, models
from kit.cli import main
from kit.planning import plan
from kit.schema import Setup
from kit.steptime import perf

X1 = "X1:memory_gib=96,memory_gbps=4000,bf16_tflops=800,sms=120,nvlink_gbps=900"


@pytest.fixture(autouse=True)
def undefined():
    """What a test defines is gone after it: the catalogue is this process's."""
    yield
    gpus.DEFINED_GPUS.clear()
    gpus.DEFINED_NETWORKS.clear()


def test_a_gpu_defined_by_its_figures_is_timed_on_them():
    made = gpus.define_gpu(X1)
    assert (made.memory_gib, made.memory_bw_gbps, made.bf16_dense_tflops, made.sms) == (96, 4000, 800, 120)
    assert made.fp16_dense_tflops == 800 and made.fp32_tflops == 0 and made.host_link_gbps == 32
    assert "X1" in gpus.gpu_names() and gpus.gpu("X1") is made
    s = Setup(model=models.preset("llama-2-7b"), cluster={"gpu": "X1"}, zero={"stage": 3}, batch={})
    hw = perf.hardware(s)
    assert (hw.peak_tflops, hw.memory_gbps, hw.sms, hw.intra_gbps) == (800, 4000, 120, 450)
    h100 = perf.step_time(s.replace(cluster={"gpu": "H100-SXM-80GB"}))
    assert perf.step_time(s).compute.seconds > h100.compute.seconds  # 800 against 989 TFLOP/s


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("X1", "--define-gpu: give NAME:key=value,..."),
        ("X1:memory_gib=96", "--define-gpu: X1 needs memory_gbps, bf16_tflops > 0"),
        ("X1:memory_gib=lots", "--define-gpu: memory_gib must be a number, got 'lots'"),
        ("X1:speed=3", "--define-gpu: 'speed=3' is not key=value with a key of memory_gib"),
        ("H100-SXM-80GB:memory_gib=80,memory_gbps=1,bf16_tflops=1", "--define-gpu: H100-SXM-80GB is a row"),
    ],
)
def test_a_bad_gpu_definition_is_one_line_naming_the_field(spec, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        gpus.define_gpu(spec)
    assert "X1" not in gpus.gpu_names()


def test_the_cli_defines_gpus_and_networks(capsys):
    argv = ["estimate", "--model", "llama-2-7b", "--stage", "3", "--gpu", "X1", "--define-gpu", X1, "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["setup"]["cluster"]["gpu"] == "X1" and data["step_time"]["hardware"]["peak_tflops"] == 800
    argv = ["plan", "--model", "llama-2-7b", "--gpus", "X1", "--price", "X1=3", "--define-gpu", X1,
            "--define-network", "slow:gbits_per_node=100", "--network", "slow", "--max-nodes", "4",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert {r["gpu"] for r in data["setups"]} == {"X1"}
    assert main(["estimate", "--model", "gpt2", "--define-gpu", "X1:memory_gib=1"]) == 2
    assert (
        capsys.readouterr().err == "zerokit estimate: --define-gpu: X1 needs memory_gbps, bf16_tflops > 0\n"
    )
    assert main(["plan", "--model", "gpt2", "--define-network", "slow:gbits_per_node=0"]) == 2
    assert "--define-network: slow needs gbits_per_node > 0" in capsys.readouterr().err


def test_a_slower_defined_fabric_slows_the_steps_that_cross_it():
    gpus.define_network("slow:gbits_per_node=100")
    s = Setup(model=models.preset("llama-2-7b"), cluster={"nodes": 4}, zero={"stage": 3}, batch={})
    need = perf.load(s)
    for fabric, gbits in (("ib-ndr-8x400", 3200), ("slow", 100)):  # the node's NICs below NVLink's 450 GB/s
        t = perf.step_time(s, perf.hardware(s, fabric))
        assert t.comm.seconds == pytest.approx(need.sent / (gbits / 8 * 0.8e9) + need.latency_s)


def test_plans_at_any_node_count(capsys):
    s = Setup(model=models.preset("llama-2-7b"), batch={"seq_len": 4096})
    found = plan.search(s, train_batch=960, gpus=["H100-SXM-80GB"], node_counts=[3, 5, 6])
    assert set(found.table.nodes) == {1, 3, 5, 6}
    with pytest.raises(ValueError, match=r"^node_counts: each must be a whole number in \[1, 4096\], got 0"):
        plan.search(s, gpus=["H100-SXM-80GB"], node_counts=[0])
    assert main(["plan", "--model", "llama-2-7b", "--node-counts", "3,x"]) == 2
    assert capsys.readouterr().err == (
        "zerokit plan: --node-counts: whole numbers in [1, 4096], comma-separated; got 'x'\n"
    )
