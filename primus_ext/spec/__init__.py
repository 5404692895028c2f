"""Frozen, validated specs of a training run."""
from primus_ext.spec.cluster import ClusterSpec
from primus_ext.spec.hardware import HardwareSpec
from primus_ext.spec.layout import PipelineLayout, pipeline_layout
from primus_ext.spec.model import ModelSpec, padded_vocab
from primus_ext.spec.parallel import ParallelSpec
from primus_ext.spec.run import RunSpec, check_run, uses_te
from primus_ext.spec.train import TrainSpec

__all__ = ["ClusterSpec", "HardwareSpec", "ModelSpec", "ParallelSpec", "PipelineLayout",
           "RunSpec", "TrainSpec", "check_run", "padded_vocab", "pipeline_layout", "uses_te"]
