"""The depthwise conv rule (conv2d_depthwise): which convs it takes and that they match onnxruntime."""

from __future__ import annotations

import pytest

pytest.importorskip("tvm")
pytest.importorskip("onnxruntime")

from tests.tvm_passes.schedules.conv_models import check_conv  # noqa: E402

pytestmark = pytest.mark.tvm

ACCEPTED = [
    pytest.param(dict(x_shape=(1, 8, 9, 13), w_shape=(8, 1, 3, 3), pads=(1, 1, 1, 1), group=8),
                 id="ragged-width-13-whole-vectors-and-a-tail"),
    pytest.param(dict(x_shape=(1, 8, 16, 16), w_shape=(8, 1, 3, 3), pads=(1, 1, 1, 1), group=8),
                 id="width-16-whole-vectors"),
    pytest.param(dict(x_shape=(1, 12, 21, 21), w_shape=(12, 1, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), group=12,
                      activation="silu"), id="stride-2-silu"),
    pytest.param(dict(x_shape=(2, 8, 11, 19), w_shape=(8, 1, 5, 5), dilations=(2, 2), pads=(4, 4, 4, 4), group=8),
                 id="batch-2-5x5-dilation-2"),
    pytest.param(dict(x_shape=(1, 4, 10, 10), w_shape=(8, 1, 3, 3), pads=(1, 1, 1, 1), group=4),
                 id="channel-multiplier-2"),
    pytest.param(dict(x_shape=(1, 8, 7, 3), w_shape=(8, 1, 3, 3), pads=(1, 1, 1, 1), group=8, bias=False,
                      activation="none"), id="row-narrower-than-a-vector-no-epilogue"),
]


@pytest.mark.parametrize("kwargs", ACCEPTED)
def test_depthwise_rule_takes_the_conv_and_matches_onnxruntime(tmp_path, kwargs):
    assert check_conv(tmp_path, **kwargs) == {"conv2d_depthwise"}


def test_grouped_convs_reducing_over_several_channels_stay_with_the_conv_rule(tmp_path):
    kwargs = dict(x_shape=(1, 8, 9, 13), w_shape=(8, 2, 3, 3), pads=(1, 1, 1, 1), group=4)
    assert check_conv(tmp_path, **kwargs) == {"conv2d_nchw"}
