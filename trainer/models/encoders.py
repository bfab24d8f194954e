"""Observation encoders shared by policies and critics: an MLP for state vectors and
a small CNN for camera images."""

from __future__ import annotations

import torch
from torch import nn


def mlp(
    input_dim: int, hidden_sizes: tuple[int, ...], output_dim: int | None = None
) -> nn.Sequential:
    """Tanh MLP; tanh keeps early Gaussian means bounded, as in most PPO baselines."""
    layers: list[nn.Module] = []
    width = input_dim
    for size in hidden_sizes:
        layers += [nn.Linear(width, size), nn.Tanh()]
        width = size
    if output_dim is not None:
        layers.append(nn.Linear(width, output_dim))
    return nn.Sequential(*layers)


class MLPEncoder(nn.Module):
    """Flat state vector ``[B, D]`` to features ``[B, hidden_sizes[-1]]``."""

    def __init__(self, obs_dim: int, hidden_sizes: tuple[int, ...]) -> None:
        super().__init__()
        if not hidden_sizes:
            raise ValueError("an MLP encoder needs at least one hidden layer")
        self.net = mlp(obs_dim, hidden_sizes)
        self.feature_dim = hidden_sizes[-1]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class CNNEncoder(nn.Module):
    """Camera image ``[B, C, H, W]`` (floats in [0, 1]) to features ``[B, feature_dim]``."""

    def __init__(
        self,
        obs_shape: tuple[int, int, int],
        channels: tuple[int, ...] = (16, 32),
        feature_dim: int = 64,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_channels = obs_shape[0]
        for out_channels in channels:
            layers += [nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1), nn.ReLU()]
            in_channels = out_channels
        layers.append(nn.Flatten())
        self.conv = nn.Sequential(*layers)
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, *obs_shape)).shape[1]
        self.head = nn.Sequential(nn.Linear(flat, feature_dim), nn.Tanh())
        self.feature_dim = feature_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(obs))


def build_encoder(
    kind: str, obs_shape: tuple[int, ...], hidden_sizes: tuple[int, ...]
) -> MLPEncoder | CNNEncoder:
    if kind == "mlp":
        if len(obs_shape) != 1:
            raise ValueError(f"an MLP needs flat observations, got shape {obs_shape}")
        return MLPEncoder(obs_shape[0], hidden_sizes)
    if kind == "cnn":
        if len(obs_shape) != 3:
            raise ValueError(f"a CNN needs [C, H, W] observations, got shape {obs_shape}")
        return CNNEncoder((obs_shape[0], obs_shape[1], obs_shape[2]), feature_dim=hidden_sizes[-1])
    raise ValueError(f"unknown model kind {kind!r}: use 'mlp' or 'cnn'")
