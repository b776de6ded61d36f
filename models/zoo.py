"""The model zoo: names, published reference figures, and ``build_torch``.

Every model is built with deterministic random weights (seed :data:`WEIGHT_SEED`, see
:mod:`models.init_weights`); there are no pretrained weights. ``size`` is the one free input dimension besides the
batch: the image side H = W for the ImageNet CNNs and the detector, the sequence length for the language models and
the encoder, the number of samples / frames for the audio models and the image width for the text recogniser
(``ModelInfo.size_meaning`` says which). ``ModelInfo.layout`` places the batch and the size in the input shape.

This module imports torch lazily: the zoo's metadata (``ZOO``, ``list_models``) and cache hits of
:func:`models.build_onnx` work without torch installed; building a model needs it.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hetpart.errors import ModelLoadError

if TYPE_CHECKING:  # torch is imported only when a model is actually built
    import torch
    from torch import nn

WEIGHT_SEED = 0
INPUT_SEED = 1
PTB_VOCAB = 10_000
PTB_SEQ_LEN = 35
BERT_VOCAB = 30_522
BERT_MAX_POSITIONS = 512

# Architecture classes: "cnn" convolutions only; "rnn" recurrent layers on an input laid out [sequence, batch, ...];
# "crnn" a convolutional front end feeding recurrent layers (batch-first input); "transformer". models/export.py
# keeps BatchNormalization as separate ONNX nodes for "cnn" and folds constants for the others (which folds the
# exporter's re-ordering of RNN gate weights into the weights).
KINDS = ("cnn", "rnn", "crnn", "transformer")
BATCH, SIZE = "batch", "size"
Layout = tuple[int | str, ...]
# Input layouts of the kinds whose models share one (a model may give its own ``input_layout`` instead).
KIND_LAYOUTS: dict[str, Layout] = {"cnn": (BATCH, 3, SIZE, SIZE), "rnn": (SIZE, BATCH), "transformer": (BATCH, SIZE)}
KIND_SIZE_MEANINGS = {"cnn": "image side", "rnn": "sequence length", "crnn": "sequence length",
                      "transformer": "sequence length"}

_TORCHVISION_TABLE = ("torchvision model table (pytorch.org/vision/stable/models.html, 'Table of all available "
                      "classification weights': Params, GFLOPS = GMACs at 224x224, batch 1) for {}")


@dataclass(frozen=True)
class ModelInfo:
    """What the zoo knows about one model.

    ``input_shape(batch, size)`` gives the single input's shape from ``layout``: ``input_layout`` when given, a
    template of ints and the placeholders :data:`BATCH` (exactly once) and :data:`SIZE` (at least once), e.g.
    ``("batch", 1, "size", 161)``; else the layout of ``kind`` (:data:`KIND_LAYOUTS`). ``size_name`` says what
    ``size`` is (default from ``kind``); sizes must be multiples of ``size_multiple``. ``published_params`` /
    ``published_gmacs`` are reference figures (multiply-accumulates in 1e9, at ``default_size`` and batch 1) with
    ``citation``; None when no published figure applies to this exact configuration. ``vocab_size`` is set for
    token-id inputs.
    """

    name: str
    family: str
    kind: str
    description: str
    input_name: str
    input_dtype: str
    output_name: str
    default_size: int
    min_size: int
    max_size: int | None
    published_params: int | None
    published_gmacs: float | None
    citation: str
    vocab_size: int | None
    constructor: str
    input_layout: Layout | None = None
    size_name: str | None = None
    size_multiple: int = 1

    def __post_init__(self) -> None:
        where = f"zoo model {self.name!r}"
        if self.kind not in KINDS:
            raise ModelLoadError(f"{where}: kind must be one of {KINDS}, found {self.kind!r}; fix its ModelInfo")
        if self.input_layout is None and self.kind not in KIND_LAYOUTS:
            raise ModelLoadError(f"{where}: kind {self.kind!r} has no default input layout; give input_layout")
        layout = self.layout
        bad = [d for d in layout if d not in (BATCH, SIZE) and not (type(d) is int and d >= 1)]
        if bad or layout.count(BATCH) != 1 or SIZE not in layout:
            raise ModelLoadError(f"{where}: input_layout must hold {BATCH!r} once, {SIZE!r} at least once and "
                                 f"positive ints otherwise, found {layout}; fix its ModelInfo")
        if self.size_multiple < 1 or self.min_size % self.size_multiple or self.default_size % self.size_multiple:
            raise ModelLoadError(f"{where}: min_size {self.min_size} and default_size {self.default_size} must be "
                                 f"multiples of size_multiple {self.size_multiple}; fix its ModelInfo")

    def construct(self) -> "nn.Module":
        """A fresh module with torch's default initialisation (``constructor`` is ``"<module>:<function>"`` in
        the ``models`` package). Honours an active ``torch.device`` context, e.g. ``meta`` for shape-only use."""
        module_name, function_name = self.constructor.split(":")
        return getattr(importlib.import_module(f"{__package__}.{module_name}"), function_name)()

    @property
    def layout(self) -> Layout:
        """The input shape template: ``input_layout``, or the layout of ``kind``."""
        return tuple(self.input_layout) if self.input_layout is not None else KIND_LAYOUTS[self.kind]

    @property
    def batch_axis(self) -> int:
        """The input axis that holds the samples (1 for the language models' [sequence, batch], usually 0)."""
        return self.layout.index(BATCH)

    @property
    def size_meaning(self) -> str:
        """What ``size`` is for this model: "image side", "sequence length", "image width", ..."""
        return self.size_name or KIND_SIZE_MEANINGS[self.kind]

    def input_shape(self, batch: int = 1, size: int | None = None) -> tuple[int, ...]:
        """Shape of the model input for ``batch`` and ``size`` (default size when None)."""
        size = self.default_size if size is None else size
        return tuple(batch if d == BATCH else size if d == SIZE else int(d) for d in self.layout)

    @property
    def default_input_shape(self) -> tuple[int, ...]:
        """Input shape at batch 1 and the default size."""
        return self.input_shape(1, None)

    def input_shapes(self, batch: int = 1, size: int | None = None) -> dict[str, tuple[int, ...]]:
        """``{input name: shape}`` for ``batch`` and ``size`` (the form the importer's shape binding takes)."""
        return {self.input_name: self.input_shape(batch, size)}

    @property
    def default_input_shapes(self) -> dict[str, tuple[int, ...]]:
        """``{input name: shape}`` at batch 1 and the default size."""
        return self.input_shapes(1, None)


def _cnn(name: str, family: str, description: str, constructor: str, params: int,
         gmacs: float, torchvision_name: str) -> ModelInfo:
    return ModelInfo(name=name, family=family, kind="cnn", description=description, input_name="input",
                     input_dtype="float32", output_name="logits", default_size=224, min_size=32, max_size=None,
                     published_params=params, published_gmacs=gmacs,
                     citation=_TORCHVISION_TABLE.format(torchvision_name), vocab_size=None,
                     constructor=constructor)


ZOO: dict[str, ModelInfo] = {info.name: info for info in (
    _cnn("resnet18", "resnet", "ResNet-18 (He et al. 2016)", "resnet:resnet18", 11_689_512, 1.81,
         "ResNet18_Weights.IMAGENET1K_V1"),
    _cnn("resnet50", "resnet", "ResNet-50 v1.5 (He et al. 2016)", "resnet:resnet50", 25_557_032, 4.09,
         "ResNet50_Weights.IMAGENET1K_V1"),
    _cnn("vgg16", "vgg", "VGG-16, config D, no BN (Simonyan & Zisserman 2015)", "vgg:vgg16", 138_357_544, 15.47,
         "VGG16_Weights.IMAGENET1K_V1"),
    _cnn("mobilenetv2", "mobilenet", "MobileNetV2 1.0 (Sandler et al. 2018)", "mobilenet:mobilenet_v2", 3_504_872,
         0.30, "MobileNet_V2_Weights.IMAGENET1K_V1"),
    _cnn("squeezenet1_1", "squeezenet", "SqueezeNet 1.1 (Iandola et al. 2016)", "squeezenet:squeezenet1_1",
         1_235_496, 0.35, "SqueezeNet1_1_Weights.IMAGENET1K_V1"),
    _cnn("densenet121", "densenet", "DenseNet-121 (Huang et al. 2017)", "densenet:densenet121", 7_978_856, 2.83,
         "DenseNet121_Weights.IMAGENET1K_V1"),
    _cnn("googlenet", "googlenet", "GoogLeNet / Inception v1 with BN, no aux heads (Szegedy et al. 2015)",
         "googlenet:googlenet", 6_624_904, 1.50, "GoogLeNet_Weights.IMAGENET1K_V1"),
    ModelInfo(name="lstm_lm", family="lstm", kind="rnn",
              description="PTB word LM: Embedding 10k x 650 -> 2-layer LSTM(650) -> Linear(650, 10k)",
              input_name="tokens", input_dtype="int64", output_name="logits", default_size=PTB_SEQ_LEN,
              min_size=1, max_size=None, published_params=None, published_gmacs=None,
              citation="Zaremba, Sutskever & Vinyals 2014, 'Recurrent Neural Network Regularization' (medium "
                       "PTB model: 2 layers, 650 units, 35 unrolled steps); layout of PyTorch "
                       "examples/word_language_model", vocab_size=PTB_VOCAB,
              constructor="rnn_lm:lstm_lm"),
    ModelInfo(name="gru_lm", family="gru", kind="rnn",
              description="PTB word LM: Embedding 10k x 650 -> 2-layer GRU(650) -> Linear(650, 10k)",
              input_name="tokens", input_dtype="int64", output_name="logits", default_size=PTB_SEQ_LEN,
              min_size=1, max_size=None, published_params=None, published_gmacs=None,
              citation="PyTorch examples/word_language_model (--model GRU) at the PTB-medium size of Zaremba "
                       "et al. 2014", vocab_size=PTB_VOCAB, constructor="rnn_lm:gru_lm"),
    ModelInfo(name="bert_small", family="bert", kind="transformer",
              description="BERT-Mini-shaped encoder: 4 layers, hidden 256, 4 heads, FFN 1024, vocab 30,522; "
                          "no token types, no pooler, no mask",
              input_name="input_ids", input_dtype="int64", output_name="last_hidden_state", default_size=128,
              min_size=1, max_size=BERT_MAX_POSITIONS, published_params=None, published_gmacs=None,
              citation="Turc et al. 2019, 'Well-Read Students Learn Better' (BERT-Mini: L=4, H=256, A=4); "
                       "Devlin et al. 2019 for the layer structure", vocab_size=BERT_VOCAB,
              constructor="bert:bert_small"),
    ModelInfo(name="conv1d_audio", family="crepe", kind="cnn",
              description="CREPE-style pitch tracker, 1-D convs as Conv2d (k, 1) on N x 1 x T x 1 raw audio: "
                          "(512, 1) conv 256 maps, (5, 1) conv 512 maps, four (64, 1) convs, 360 pitch bins",
              input_name="audio", input_dtype="float32", output_name="pitch_activations", default_size=1024,
              min_size=1024, max_size=None, published_params=None, published_gmacs=None,
              citation="Kim et al. 2018, 'CREPE: A Convolutional Representation for Pitch Estimation' (scaled "
                       "down; conv-stack block as in the Tacotron 2 encoder, Shen et al. 2018)", vocab_size=None,
              constructor="conv1d_audio:conv1d_audio", input_layout=(BATCH, 1, SIZE, 1),
              size_name="number of audio samples"),
    ModelInfo(name="crnn_ocr", family="crnn", kind="crnn",
              description="CRNN text recogniser: 7-conv VGG-style stack on a 32 x W grey image -> W/4 + 1 columns "
                          "-> 2-layer bidirectional LSTM(256) -> Linear(512, 37)",
              input_name="image", input_dtype="float32", output_name="logits", default_size=128, min_size=8,
              max_size=None, published_params=None, published_gmacs=None,
              citation="Shi, Bai & Yao 2017, 'An End-to-End Trainable Neural Network for Image-based Sequence "
                       "Recognition and Its Application to Scene Text Recognition' (Table 1)", vocab_size=None,
              constructor="crnn_ocr:crnn_ocr", input_layout=(BATCH, 1, 32, SIZE), size_name="image width"),
    ModelInfo(name="yolo_detector", family="yolox", kind="cnn",
              description="YOLOX-Nano detector: Focus stem, CSP-Darknet (depth 0.33, width 0.25, depthwise), PAN "
                          "neck, decoupled heads; raw predictions [N, anchors, 85], no NMS",
              input_name="images", input_dtype="float32", output_name="predictions", default_size=416,
              min_size=64, max_size=None, published_params=None, published_gmacs=None,
              citation="Ge et al. 2021, 'YOLOX: Exceeding YOLO Series in 2021' (YOLOX-Nano; the README's 0.91M "
                       "params / 1.08 GFLOPs are rounded, and its GFLOPs are 2 x thop's count, BatchNorm included)",
              vocab_size=None, constructor="yolo_detector:yolo_detector", size_multiple=32),
    ModelInfo(name="gru_audio", family="conv_gru", kind="crnn",
              description="Noise suppressor: three 3x3 convs on a 1 x T x 161 spectrogram -> 2-layer GRU(256) -> "
                          "Linear(256, 161) sigmoid gains per frame",
              input_name="spectrogram", input_dtype="float32", output_name="mask", default_size=100, min_size=1,
              max_size=None, published_params=None, published_gmacs=None,
              citation="Amodei et al. 2016, 'Deep Speech 2' (conv front end on 161-bin spectrograms, GRU layers), "
                       "scaled down; gain-mask head as in Valin 2018, RNNoise", vocab_size=None,
              constructor="gru_audio:gru_audio", input_layout=(BATCH, 1, SIZE, 161),
              size_name="number of spectrogram frames"),
    ModelInfo(name="lstm_speaker", family="ge2e", kind="rnn",
              description="GE2E speaker encoder: 3-layer LSTM(256) over [T, N, 40] mel frames -> Linear(256, 256) "
                          "ReLU of the last hidden state -> L2-normalised embedding",
              input_name="mels", input_dtype="float32", output_name="embedding", default_size=160, min_size=1,
              max_size=None, published_params=None, published_gmacs=None,
              citation="Wan et al. 2018, 'Generalized End-to-End Loss for Speaker Verification'; sizes of the "
                       "Real-Time-Voice-Cloning encoder (Jemine 2019)", vocab_size=None,
              constructor="lstm_speaker:lstm_speaker", input_layout=(SIZE, BATCH, 40),
              size_name="number of mel frames"),
)}


def list_models() -> list[str]:
    """Names of all zoo models, in a stable order."""
    return list(ZOO)


def get_info(name: str) -> ModelInfo:
    """The :class:`ModelInfo` of ``name``; raises ModelLoadError listing the known names when unknown."""
    try:
        return ZOO[name]
    except KeyError:
        raise ModelLoadError(
            f"unknown zoo model {name!r}: the name must be one of {', '.join(ZOO)}; pass one of these, or a path "
            f"to an ONNX file") from None


def check_shape_args(info: ModelInfo, batch: int, size: int | None) -> int:
    """Validate ``batch`` and ``size`` for ``info``; returns the effective size. Raises ModelLoadError."""
    size = info.default_size if size is None else size
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ModelLoadError(f"batch must be a positive int, got {batch!r}; pass e.g. batch=1")
    upper = info.max_size if info.max_size is not None else float("inf")
    if (not isinstance(size, int) or isinstance(size, bool) or not info.min_size <= size <= upper
            or size % info.size_multiple):
        multiple = f" and a multiple of {info.size_multiple}" if info.size_multiple > 1 else ""
        raise ModelLoadError(
            f"{info.name}: {info.size_meaning} must be an int in [{info.min_size}, {info.max_size or 'inf'}]"
            f"{multiple}, got {size!r}; pass size=None for the default {info.default_size}")
    return size


def build_torch(name: str, batch: int = 1,
                size: int | None = None) -> tuple["nn.Module", tuple["torch.Tensor", ...]]:
    """Build zoo model ``name`` as a torch module in eval mode with seeded random weights, plus example inputs.

    The example input has shape ``ZOO[name].input_shape(batch, size)``: float32 N(0, 1) values for the image and
    audio models, uniform random token ids for the language models and the encoder (seed :data:`INPUT_SEED`). The
    module itself works for any batch and size in range; ``batch`` and ``size`` only shape the example input.
    """
    import torch

    from .init_weights import randomize_

    info = get_info(name)
    size = check_shape_args(info, batch, size)
    with torch.device("meta"):  # skip torch's default init: randomize_ overwrites every parameter
        module = info.construct()
    module = module.to_empty(device="cpu")
    with torch.no_grad():
        for buffer in module.buffers():
            buffer.zero_()
    randomize_(module, torch.Generator().manual_seed(WEIGHT_SEED))
    module.eval()
    return module, (example_input(info, batch, size),)


def example_input(info: ModelInfo, batch: int, size: int) -> "torch.Tensor":
    """A deterministic input tensor for ``info`` at ``batch`` x ``size``."""
    import torch

    generator = torch.Generator().manual_seed(INPUT_SEED)
    shape = info.input_shape(batch, size)
    if info.input_dtype == "float32":
        return torch.randn(shape, generator=generator)
    assert info.vocab_size is not None, f"{info.name}: integer input needs a vocabulary size"
    return torch.randint(0, info.vocab_size, shape, generator=generator, dtype=torch.int64)
