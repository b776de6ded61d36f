"""The hetpart model zoo: torch modules and ONNX files with seeded random weights.

>>> from models import ZOO, build_torch, build_onnx
>>> module, (x,) = build_torch("resnet18", batch=2, size=64)
>>> path = build_onnx("resnet18", batch=2, size=64)                  # cached under ~/.cache/hetpart/models
>>> path = build_onnx("vgg16", weights="inputs")                     # weights as graph inputs: tiny file
"""
from .export import (BUILDER_VERSION, PARAM_INPUT_PREFIX, PARAM_INPUTS_KEY, build_onnx, cache_key,
                     default_cache_dir, export_model, param_input_names)
from .zoo import ZOO, ModelInfo, build_torch, get_info, list_models

__all__ = ["ZOO", "ModelInfo", "build_torch", "build_onnx", "list_models", "get_info", "export_model",
           "param_input_names", "cache_key", "default_cache_dir", "BUILDER_VERSION", "PARAM_INPUT_PREFIX",
           "PARAM_INPUTS_KEY"]
