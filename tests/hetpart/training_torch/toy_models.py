"""Small BatchNorm-free models for the training tests (factories ``f(batch) -> (module, example_inputs)``, the form
``ModelSource("tests.hetpart.training_torch.toy_models:toy_cnn", ...)`` imports in every pipeline process)."""
from __future__ import annotations

import torch
from torch import nn


class ResBlock(nn.Module):
    """relu(x + conv(relu(conv(x)))): the skip stays inside the unit."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.conv2(torch.relu(self.conv1(x))))


class ToyCNN(nn.Module):
    """stem conv, 2 residual blocks, a strided conv, 2 residual blocks, dropout, global pool (glue) + linear head.
    The Dropout imports to no kernel, so it is folded into the unit before it."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.blocks = nn.Sequential(ResBlock(8), ResBlock(8), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                                    ResBlock(16), ResBlock(16), nn.Dropout(0.1))
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class Mix(nn.Module):
    """A unit with two inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return self.lin(h + g)


class SkipNet(nn.Module):
    """Three units where the first unit's output is also read by the third (a skip across a unit)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.c = Mix()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        return self.c(h, torch.tanh(self.b(h)))


def toy_cnn(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(1234)
    model = ToyCNN()
    return model, (torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(7)),)


def skip_net(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(1234)
    return SkipNet(), (torch.randn(batch, 16, generator=torch.Generator().manual_seed(7)),)


class SharedLinear(nn.Module):
    """One Linear applied twice: a unit that runs twice (refused)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(self.b(self.a(x)))
