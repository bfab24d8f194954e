"""Policies with action chunks and dynamic horizons, critics and the plan cache."""

from trainer.models.critic import ValueCritic
from trainer.models.encoders import CNNEncoder, MLPEncoder, build_encoder
from trainer.models.interface import ChunkedPolicy
from trainer.models.plan_cache import ChunkDraw, PlanCache, assign_horizons
from trainer.models.policy import GaussianChunkPolicy

__all__ = [
    "CNNEncoder",
    "ChunkDraw",
    "ChunkedPolicy",
    "GaussianChunkPolicy",
    "MLPEncoder",
    "PlanCache",
    "ValueCritic",
    "assign_horizons",
    "build_encoder",
]
