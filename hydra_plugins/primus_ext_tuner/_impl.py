"""The primus_tuner sweeper: Hydra sweep syntax in, the tuner in-process, jobs out.

1. The task overrides are split: sweeps of layout keys become the tuner's search axes
   (``tune.space.<axis>``), plain overrides of layout keys pin their axis, everything
   else fixes the job. A sweep of a key that is not a layout axis (the model, the global
   batch) is refused: the tuner searches the layout of one job.
2. The job's config is composed through Hydra's own config loader, turned into a RunSpec
   and TuneSettings, and ``primus_ext.tune.run.tune`` searches in this process: no job
   directory per candidate (the projector is a pure function, milliseconds a call).
3. The journal, report, plot and recipe go to ``hydra.sweep.dir``, with
   ``optimization_results.yaml`` (Hydra's sweeper convention: the best parameters and
   value) beside them.
4. ``shards=N``: the candidates are scored by N jobs of the configured launcher (an
   exhaustive search's points, or a guided search's clusters, split over them) and
   merged (``_shards``); the search, journal and recipe are those of one process.
5. ``validate_top_k=N``: the N best candidates are launched as ordinary jobs through
   the configured launcher (basic: here, one after another; submitit or Ray where
   installed); their returns are shown beside the projections and written to
   ``summary.csv``.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.core.utils import JobReturn
from hydra.errors import CompactHydraException
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

log = logging.getLogger(__name__)

# Config keys a user sweeps -> the tuner's search axes (primus_ext.tune.settings).
AXIS_OF_KEY = {
    "parallel.tp": "tp", "parallel.pp": "pp", "parallel.vpp": "vpp", "parallel.cp": "cp",
    "parallel.ep": "ep", "parallel.etp": "etp",
    "parallel.sequence_parallel": "sequence_parallel",
    "parallel.overlap_grad_reduce": "overlap_grad_reduce",
    "parallel.overlap_param_gather": "overlap_param_gather",
    "parallel.tp_comm_overlap": "tp_comm_overlap", "parallel.schedule": "schedule",
    "train.micro_batch_size": "micro_batch_size",
    "train.recompute_granularity": "recompute_granularity",
    "train.recompute_method": "recompute_method",
    "train.recompute_num_layers": "recompute_num_layers",
    "train.precision": "precision",
    "cluster.num_nodes": "num_nodes", "cluster.hardware": "hardware",
}
_SPACE_PREFIX = "tune.space."


class TunerSweepError(CompactHydraException):
    """A user error in a primus_tuner sweep: Hydra prints the message alone and exits
    non-zero (no traceback)."""


RESULTS_FILE = "optimization_results.yaml"
SUMMARY_FILE = "summary.csv"


def search_axes(overrides: Sequence[Override]) -> tuple[list[str], Dict[str, list]]:
    """(job overrides, {axis: values}) from parsed task overrides.

    A sweep of a layout key gives the axis its values; a plain override of one pins the
    axis to that value and stays a job override too (the baseline layout).
    """
    from primus_ext.tune.settings import SPACE_AXES

    fixed: list[str] = []
    axes: Dict[str, list] = {}
    for ov in overrides:
        key = ov.get_key_element()
        axis = AXIS_OF_KEY.get(key)
        if key.startswith(_SPACE_PREFIX) and key[len(_SPACE_PREFIX):] in SPACE_AXES:
            axis = key[len(_SPACE_PREFIX):]
        if ov.is_sweep_override():
            if axis is None:
                raise TunerSweepError(
                    f"{key}: primus_tuner searches the layout of one job; sweepable keys: "
                    f"{', '.join(AXIS_OF_KEY)} and tune.space.<axis> for "
                    f"{', '.join(SPACE_AXES)} (sweep other keys with the basic sweeper)")
            if not ov.is_discrete_sweep():
                raise TunerSweepError(f"{key}: primus_tuner needs a discrete sweep "
                                     "(a,b,c / choice(...) / range(...)), not "
                                     f"{ov.value_type.name if ov.value_type else '?'}")
            axes[axis] = list(ov.sweep_iterator())
            if key in ("cluster.hardware", "cluster.num_nodes"):
                # The job (and its baseline) lives on the first swept cluster, not on
                # the config's default one.
                fixed.append(f"{key}={axes[axis][0]}")
            continue
        if axis is not None:
            value = ov.value()
            axes[axis] = list(value) if isinstance(value, list) else [value]
            if key.startswith(_SPACE_PREFIX):
                continue
        fixed.append(f"{key}={ov.get_value_element_as_str()}")
    return fixed, axes


def merge_overrides(base: Sequence[str], top: Sequence[str]) -> list[str]:
    """``base`` then ``top``, a key given in both keeping ``top``'s value."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in top}
    return [o for o in base if o.split("=", 1)[0].lstrip("+~") not in keys] + list(top)


class PrimusTunerSweeperImpl:
    def __init__(self, validate_top_k: int = 0, max_batch_size: Optional[int] = None,
                 params: Optional[Dict[str, str]] = None, shards: int = 1) -> None:
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"hydra.sweeper.shards={shards!r} must be an integer >= 1 "
                             "(launcher jobs that score the candidates)")
        self.shards = shards
        if isinstance(validate_top_k, bool) or not isinstance(validate_top_k, int) \
                or validate_top_k < 0:
            raise ValueError(f"hydra.sweeper.validate_top_k={validate_top_k!r} must be an "
                             "integer >= 0")
        self.validate_top_k = validate_top_k
        self.max_batch_size = max_batch_size
        self.params = dict(params or {})
        self.hydra_context: Optional[HydraContext] = None
        self.config: Optional[DictConfig] = None
        self.launcher: Optional[Launcher] = None
        self.result: Any = None  # the TuneResult, for callers and tests

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    # ---- the sweep ----------------------------------------------------------------------
    def sweep(self, arguments: List[str]) -> Any:
        assert self.config is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        params = [f"{k}={v}" for k, v in self.params.items()]
        fixed, axes = search_axes(parser.parse_overrides(params + list(arguments)))

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")

        spec, settings = self._tuner_inputs(fixed, axes, sweep_dir)
        from primus_ext.tune.run import tune

        log.info("primus_tuner: axes %s, recipe into %s", axes, sweep_dir)
        try:
            prefetched = None
            if self.shards > 1:
                from ._shards import score_in_shards
                prefetched = score_in_shards(self.hydra_context, self.config, spec,
                                             settings, self.shards, sweep_dir)
            result = tune(spec, settings, overrides=fixed, prefetched=prefetched)
        except ValueError as exc:  # a setting the tuner rejects, e.g. cost without price
            raise TunerSweepError(f"primus_tuner: {exc}") from exc
        self.result = result
        if result.best is None:
            raise TunerSweepError("primus_tuner: no candidate fits; see "
                                 f"{sweep_dir / 'trials.jsonl'} for each one's verdict")
        k = self.validate_top_k
        top = result.top(max(k, min(result.settings.top_k, 5)))  # shown; the first k run
        candidates = [(t, self._candidate_overrides(result, t, fixed)) for t in top]
        returns = self._validate(fixed, candidates[:k]) if k else []
        from ._report import print_report, write_results, write_summary

        write_results(sweep_dir / RESULTS_FILE, result, candidates, returns)
        if returns:
            write_summary(sweep_dir / SUMMARY_FILE, candidates, returns)
        print_report(result, candidates, returns, sweep_dir)
        return returns

    def _tuner_inputs(self, fixed: list[str], axes: Dict[str, list], sweep_dir: Path):
        from primus_ext.config import tune_spec
        from primus_ext.tune.settings import TuneSettings

        assert self.hydra_context is not None and self.config is not None
        cfg = self.hydra_context.config_loader.load_sweep_config(
            master_config=self.config, sweep_overrides=list(fixed))
        with read_write(cfg), open_dict(cfg):
            del cfg["hydra"]  # the task's view, as a job would see it
        try:
            spec, unstated = tune_spec(cfg)
            data = OmegaConf.to_container(cfg.tune, resolve=False)
            space = dict(data.get("space") or {})
            space.update(axes)
            data["space"] = space
            data["out_dir"] = str(sweep_dir)  # results and recipe into the sweep dir
            settings = TuneSettings.from_dict(
                data, calibration=cfg.get("calibration", "default"),
                profile=cfg.get("profile"), unstated=unstated)
        except ValueError as exc:  # a user error: one line, as the app reports it
            raise TunerSweepError(f"primus_tuner: {exc}") from exc
        return spec, settings

    @staticmethod
    def _candidate_overrides(result, trial, fixed: list[str]) -> list[str]:
        """The Hydra overrides that compose to ``trial``'s RunSpec (as the recipe's)."""
        from primus_ext.emit.overrides import spec_overrides

        return spec_overrides(result.spec_of(trial.point), fixed)

    # ---- validation jobs ----------------------------------------------------------------
    def _validate(self, fixed: list[str], candidates) -> list[JobReturn]:
        assert self.launcher is not None
        job_base = [o for o in fixed
                    if o.split("=", 1)[0] != "mode" and not o.startswith("tune.")]
        # Each job trains the candidate's recipe line for a few iterations (mode=train:
        # measured iteration time and memory beside the projection).
        batch = [merge_overrides(job_base, ovs) + ["mode=train"] for _, ovs in candidates]
        self.validate_batch_is_legal(batch)
        size = self.max_batch_size or len(batch)
        returns: list[JobReturn] = []
        for start in range(0, len(batch), size):
            returns.extend(self.launcher.launch(batch[start:start + size],
                                                initial_job_idx=start))
        return returns

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        # As Sweeper.validate_batch_is_legal: compose every job before launching any.
        assert self.hydra_context is not None and self.config is not None
        for overrides in batch:
            self.hydra_context.config_loader.load_sweep_config(
                master_config=self.config, sweep_overrides=list(overrides))
