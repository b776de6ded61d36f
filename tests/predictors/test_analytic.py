"""Analytic roofline GPU model: formula, monotonicity, labelling."""
import dataclasses

import numpy as np
import pytest

from hetpart.devices import GPU_PRESETS
from hetpart.errors import PredictorError, UnknownDeviceError
from predictors.analytic import ASSUMED_EFFICIENCY, AnalyticGpuModel
from tests.predictors.synthetic_kernels import conv_node, elementwise_node, matmul_node


def test_latency_is_launch_overhead_plus_the_roofline_bound():
    model = AnalyticGpuModel("t4")
    preset = GPU_PRESETS["t4"]
    conv = conv_node(0, 8, 256, 256, 56, 3)            # compute bound
    eff_c, _ = ASSUMED_EFFICIENCY["conv2d"]
    expected = preset.launch_overhead_us + 1e6 * conv.flops / (preset.peak_flops_per_s * eff_c)
    add = elementwise_node(1, (8, 256, 56, 56))         # memory bound
    _, eff_m = ASSUMED_EFFICIENCY["elementwise"]
    expected_add = preset.launch_overhead_us + 1e6 * (add.bytes_read + add.bytes_written) / (
        preset.memory_bandwidth_bytes_per_s * eff_m)
    assert np.allclose(model.predict([conv, add]), [expected, expected_add], rtol=1e-12)


@pytest.mark.parametrize("preset", sorted(GPU_PRESETS))
def test_monotone_in_flops_and_bytes_and_labelled_analytic(preset):
    model = AnalyticGpuModel(preset)
    base = matmul_node(0, 64, 256, 256)
    more_flops = [dataclasses.replace(base, flops=base.flops * s) for s in (1, 2, 10, 100, 1000)]
    more_bytes = [dataclasses.replace(base, bytes_read=base.bytes_read * s) for s in (1, 2, 10, 100, 1000)]
    for series in (model.predict(more_flops), model.predict(more_bytes)):
        assert np.all(np.diff(series) >= 0) and np.all(np.isfinite(series))
        assert series[0] >= GPU_PRESETS[preset].launch_overhead_us and series[-1] > series[0]
    assert model.source == "analytic"
    prov = model.provenance()
    assert prov["source"] == "analytic" and prov["citation"] and "efficiencies_assumed_not_measured" in prov
    assert model.device_spec().source == "datasheet"
    to_gpu, back = model.links()
    assert (to_gpu.src, to_gpu.dst, back.src, back.dst) == ("cpu", "gpu", "gpu", "cpu")


def test_bad_preset_or_efficiency_is_rejected():
    with pytest.raises(UnknownDeviceError):
        AnalyticGpuModel("gtx-imaginary")
    with pytest.raises(PredictorError):
        AnalyticGpuModel("t4", efficiencies={"conv2d": (1.5, 0.5)})
    with pytest.raises(PredictorError):
        AnalyticGpuModel("t4", efficiencies={"not-a-kind": (0.5, 0.5)})
