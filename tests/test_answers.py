"""The answers notebooks 03 and 09 end with (``kit.lab.answers``): the setting they name is the fastest
that fits by the same estimates and step times the notebooks' tables show, and every figure they print
is those tables'."""

import re

from kit import models
from kit.estimate import estimate
from kit.lab import answers
from kit.schema import Setup
from kit.steptime import calibrated
from kit.steptime.comm import comm_by_scope
from kit.units import GIB


def test_the_offload_answer_is_the_fastest_setting_that_fits():
    setup = Setup(model=models.preset("llama-2-7b"), cluster={"gpus_per_node": 8}, batch={"micro_batch": 1})
    text = answers.offload(setup)
    times = {name: calibrated.step_time(setup.replace(zero=z)).step_s for name, z in answers.OFFLOADS}
    best = min(times, key=times.get)  # every one fits on 80 GB at micro batch 1
    assert text.startswith(f"**The answer for llama-2-7b on 1 x 8 H100-SXM-80GB, micro batch 1**: **{best}**")
    e = estimate(setup.replace(zero=dict(answers.OFFLOADS)[best]))
    assert f"{e.per_gpu_bytes / GIB:.1f} GiB per GPU, {times[best]:.2f} s per step" in text
    offloaded = "ZeRO-2 + CPU optimizer offload"
    change = times[offloaded] / times[best] - 1
    assert f"{offloaded}: " in text and f"({change:+.0%}".replace("%", " %") in text


def test_the_offload_answer_says_what_to_do_when_nothing_fits():
    huge = Setup(
        model=models.preset("llama-2-70b"),
        cluster={"gpus_per_node": 1, "gpu": "L4"},
        batch={"micro_batch": 1},
    )
    assert "none of these fits; the leanest, ZeRO-3 + CPU optimizer and parameter offload" in answers.offload(
        huge
    )


def test_the_zeropp_answer_counts_what_crosses_nodes():
    setup = Setup(
        model=models.preset("llama-2-7b"),
        cluster={"nodes": 2, "gpus_per_node": 8},
        zero={"stage": 3},
        batch={"micro_batch": 1, "seq_len": 4096},
    )
    text = answers.zeropp(setup)
    chosen = re.search(r"\*\*: \*\*(.+?)\*\*, the fastest that fits", text).group(1)
    assert f"- ZeRO-3: {comm_by_scope(setup)['inter'] / GIB:.2f} GiB per GPU per step across nodes" in text
    assert chosen == "ZeRO++ (hpZ + qwZ + qgZ)"  # 5x fewer bytes across nodes, and it fits
    one = setup.replace(cluster={"nodes": 1})
    assert "one node, nothing crosses a network" in answers.zeropp(one)
