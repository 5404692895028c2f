"""The primus-ext tuner as a Hydra Sweeper (``hydra/sweeper=primus_tuner``).

A thin shell, as Hydra's optuna and nevergrad sweepers are: the config dataclass and its
``ConfigStore`` entry, and a Sweeper that hands every call to ``_impl``. Hydra imports
this module on every start of every Hydra app (plugin discovery), so the tuner itself
is imported only when the sweeper is built.

    primus-ext -m hydra/sweeper=primus_tuner model=llama3_70b cluster.num_nodes=8 \\
        parallel.tp=choice(1,2,4,8) parallel.pp=range(1,5) hydra.sweeper.validate_top_k=2

Sweep axes use Hydra's sweep syntax (``a,b,c``, ``choice(...)``, ``range(...)``) on the
layout keys (``parallel.tp``, ``train.micro_batch_size``, ``cluster.num_nodes``, ... or
``tune.space.<axis>``); a plain override of a layout key pins that axis; axes not named
keep the tuner's defaults. The search runs in this process (no job per candidate); the
journal, report and recipe go to ``hydra.sweep.dir``; ``validate_top_k=N`` launches the
N best candidates as jobs through the configured launcher.
"""
# No `from __future__ import annotations` here: Hydra's plugin scan executes this module
# outside sys.modules, where dataclasses cannot resolve string annotations, and
# OmegaConf reads the real types of the config dataclass.
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class PrimusTunerSweeperConf:
    _target_: str = (
        "hydra_plugins.primus_ext_tuner.primus_tuner_sweeper.PrimusTunerSweeper")
    # Launch the N best candidates as jobs (0: search only) and show their returns
    # beside the projections.
    validate_top_k: int = 0
    # Jobs per launcher call when validating (null: all N in one batch).
    max_batch_size: Optional[int] = None
    # Sweep axes given in config rather than on the command line (command line wins),
    # e.g. {"parallel.tp": "choice(1,2,4,8)"}.
    params: Optional[Dict[str, str]] = None
    # Score the candidates in N jobs of the configured launcher (an exhaustive search's
    # points, or a guided search's clusters; hydra/launcher=submitit_slurm: N cluster
    # jobs), merged into the one-process search (1: all here).
    shards: int = 1


ConfigStore.instance().store(group="hydra/sweeper", name="primus_tuner",
                             node=PrimusTunerSweeperConf, provider="primus_ext")


class PrimusTunerSweeper(Sweeper):
    def __init__(self, validate_top_k: int = 0, max_batch_size: Optional[int] = None,
                 params: Optional[Dict[str, str]] = None, shards: int = 1) -> None:
        from ._impl import PrimusTunerSweeperImpl

        self.sweeper = PrimusTunerSweeperImpl(validate_top_k=validate_top_k,
                                              max_batch_size=max_batch_size,
                                              params=params, shards=shards)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function,
                           config=config)

    def sweep(self, arguments: List[str]) -> Any:
        return self.sweeper.sweep(arguments)
