"""Host tensors in and out of TVM: exact copies, owned by their receiver, for every dtype and layout."""
import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm_passes.host_tensors import ALIGNMENT_BYTES, aligned_copy, to_host_tensor, to_numpy  # noqa: E402

DTYPES = ["float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"]
SHAPES = [(3, 5), (2, 1, 7), (1,), (), (0, 4)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_is_exact_and_keeps_shape_and_dtype(dtype, shape):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 50).astype(dtype)
    tensor = to_host_tensor(x, tvm.cpu(0))
    assert tuple(tensor.shape) == shape and str(tensor.dtype) == dtype
    y = to_numpy(tensor)
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(y, x)


def test_the_tensor_owns_its_data_and_the_array_read_back_owns_its_own():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = to_host_tensor(x, tvm.cpu(0))
    x[...] = -1                                         # the caller reuses its buffer at once
    y = to_numpy(tensor)
    np.testing.assert_array_equal(y, np.arange(12, dtype=np.float32).reshape(3, 4))
    y[...] = 7                                          # the receiver writes its copy
    np.testing.assert_array_equal(to_numpy(tensor), np.arange(12, dtype=np.float32).reshape(3, 4))
    assert y.flags.writeable


def test_strided_views_and_other_cpu_devices_are_copied_correctly():
    base = np.arange(48, dtype=np.float32).reshape(4, 12)
    view = base[:, ::3]
    np.testing.assert_array_equal(to_numpy(to_host_tensor(view, tvm.cpu(0))), view)
    on_second = to_host_tensor(base, tvm.cpu(1))        # the emulated GPU's device: TVM's own copy path
    assert on_second.device.index == 1
    np.testing.assert_array_equal(to_numpy(on_second), base)


@pytest.mark.parametrize("offset", [0, 1, 3, 17])
def test_aligned_copy_starts_on_the_boundary_tvm_requires(offset):
    x = np.frombuffer(np.arange(64, dtype=np.uint8).tobytes()[offset:offset + 40], dtype=np.uint8)
    out = aligned_copy(x.view(np.uint8))
    assert out.ctypes.data % ALIGNMENT_BYTES == 0 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, x)
