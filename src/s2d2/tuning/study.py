"""The Optuna study behind ``s2d2 tune``: multi-objective search, AR reference, resume, progress.

Objectives: accuracy (maximised) and NFE per generated token (minimised), plus seconds per problem
with ``wall_time``. TPE samples the conditional space of :mod:`.space`; its constraint is AR's
accuracy minus ``max_drop``, so the search concentrates where a preset may be chosen. A new study first
tries the hand-written starting points of :data:`.space.SEED_POINTS`. AR runs once per study: its
figures are stored in the study, so a resumed study (same ``storage`` and study name) reuses them and
adds trials to those it has.
"""

from __future__ import annotations

import datetime
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import S2D2Error
from ..presets import PresetFile
from .choice import TrialPoint, accuracy_floor, choose, complete_points
from .progress import TuneProgress
from .space import SEED_POINTS, SearchSpace
from .trial_eval import DevFigures, DevSet, evaluate


@dataclass
class TuneSpec:
    """What to tune on and how long (the ``s2d2 tune`` options)."""

    model: str
    task: str = "tiny-gsm"
    split: str = "dev"
    n: int | None = None
    data: str | None = None
    max_drop: float = 0.01
    trials: int = 40
    time_budget_min: float | None = None
    storage: str | None = None
    wall_time: bool = False
    seed: int = 0

    def study_name(self) -> str:
        """Derived from model, task, split (or data file) and n: the same run resumes the same study."""
        from pathlib import Path

        source = f"data={Path(self.data).name}" if self.data else f"split={self.split}"
        name = f"s2d2-tune:{Path(self.model).name or self.model}:{self.task}:{source}:n={self.n or 'all'}"
        return name + (":wall" if self.wall_time else "")


@dataclass
class TuneOutcome:
    """A finished ``tune``: the study, AR's figures, every trial, the chosen one and its preset."""

    study: Any
    ar: DevFigures
    points: list[TrialPoint]
    chosen: TrialPoint
    within_max_drop: bool
    preset: PresetFile
    new_trials: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def open_study(spec: TuneSpec) -> Any:
    """Create the study, or load it from ``spec.storage`` when it exists."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    directions = ["maximize", "minimize"] + (["minimize"] if spec.wall_time else [])
    name = spec.study_name()
    done = 0
    if spec.storage is not None:
        try:
            done = len(optuna.load_study(study_name=name, storage=spec.storage).trials)
        except KeyError:
            done = 0
        except Exception as exc:  # bad URL, unreadable database: one line
            raise S2D2Error(f"cannot open --storage {spec.storage}: {str(exc).splitlines()[0]}") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # multivariate/group TPE and constraints are "experimental"
        sampler = optuna.samplers.TPESampler(
            seed=spec.seed + done,  # a resumed run must not replay the first run's random draws
            multivariate=True,
            group=True,
            constraints_func=lambda t: [t.user_attrs.get("constraint", 1.0)],
        )
        study = optuna.create_study(
            study_name=name, storage=spec.storage, directions=directions, sampler=sampler, load_if_exists=True
        )
    if len(study.directions) != len(directions):
        raise S2D2Error(
            f"study {name} in {spec.storage} has {len(study.directions)} objectives, not {len(directions)}"
        )
    return study


def ar_figures(study: Any, model: Any, dev: DevSet) -> DevFigures:
    """AR's figures on the dev problems: measured once, then read from the study."""
    stored = study.user_attrs.get("ar")
    fp = dev.fingerprint()
    if stored is not None:
        if study.user_attrs.get("problems") != fp:
            raise S2D2Error(f"study {study.study_name} was tuned on other problems; use another --storage")
        return DevFigures.from_dict(stored)
    figures = evaluate(model, dev, {"decoder": "ar"})
    study.set_user_attr("ar", figures.to_dict())
    study.set_user_attr("problems", fp)
    return figures


def make_objective(model: Any, dev: DevSet, space: SearchSpace, floor: float, wall_time: bool) -> Any:
    """The trial function: sample settings, decode the dev set batched, return the objectives."""

    def objective(trial: Any) -> tuple[float, ...]:
        settings = space.suggest(trial)
        model.make_config(**settings)  # an invalid combination fails the trial, not the study
        routing = getattr(getattr(model, "engine", None), "routing", None)
        if routing is not None:
            routing.clear()  # engine-scoped UCB must learn within the trial, not from earlier trials
        fig = evaluate(model, dev, settings)
        trial.set_user_attr("settings", settings)
        trial.set_user_attr("figures", fig.to_dict())
        trial.set_user_attr("constraint", floor - fig.accuracy)
        objectives = (fig.accuracy, fig.nfe_per_token)
        return objectives + ((fig.seconds_per_problem,) if wall_time else ())

    return objective


def run_tune(
    model: Any, dev: DevSet, spec: TuneSpec, *, space: SearchSpace | None = None, progress: bool = True
) -> TuneOutcome:
    """Run (or resume) the study for ``spec.trials`` more trials or ``spec.time_budget_min`` minutes,
    whichever ends first; return the chosen trial and its preset."""
    space = space or SearchSpace(family=getattr(getattr(model, "info", None), "family", "sdar"))
    study = open_study(spec)
    t0 = time.perf_counter()
    ar = ar_figures(study, model, dev)
    floor = accuracy_floor(ar.accuracy, spec.max_drop)
    if not study.trials:
        for point in SEED_POINTS[: spec.trials]:
            study.enqueue_trial(point, skip_if_exists=True)
    before = _finished(study)
    budget = None if spec.time_budget_min is None else spec.time_budget_min * 60.0
    bar = TuneProgress(spec.trials, budget, ar.accuracy, floor, enabled=progress, started=t0)
    timeout = None if budget is None else max(budget - (time.perf_counter() - t0), 1.0)
    try:
        study.optimize(
            make_objective(model, dev, space, floor, spec.wall_time),
            n_trials=spec.trials,
            timeout=timeout,
            callbacks=[bar],
            catch=(S2D2Error,),
            gc_after_trial=False,
        )
    finally:
        bar.close()
    points = complete_points(study)
    if not points:
        raise S2D2Error("no trial finished; give more --trials or a longer --time-budget")
    chosen, ok = choose(points, ar.accuracy, spec.max_drop)
    seconds = time.perf_counter() - t0
    out = TuneOutcome(study, ar, points, chosen, ok, PresetFile("", {}), _finished(study) - before, seconds)
    out.preset = build_preset(spec, out, dev)
    if not ok:
        out.notes.append(
            f"no trial is within {spec.max_drop:g} of AR's accuracy {ar.accuracy:.3f}; "
            f"chose the most accurate one (trial {chosen.number}, {chosen.accuracy:.3f})"
        )
    return out


def _finished(study: Any) -> int:
    """Trials that ran (complete, failed or pruned), not those only queued."""
    from optuna.trial import TrialState

    return len(
        study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED))
    )


def build_preset(spec: TuneSpec, out: TuneOutcome, dev: DevSet, name: str | None = None) -> PresetFile:
    """The preset file of the chosen trial: its settings, what it was tuned on, its and AR's figures."""
    from ..version import __version__

    c = out.chosen
    tuned_on = {
        "model": spec.model,
        "task": spec.task,
        "split": None if spec.data else spec.split,
        "data": spec.data,
        "n": len(dev.problems),
        "max_new_tokens": dev.max_new_tokens,
        "max_drop": spec.max_drop,
        "study": out.study.study_name,
        "trials": len(out.points),
        "seconds_this_run": round(out.seconds, 1),
        "date": datetime.date.today().isoformat(),
        "s2d2_version": __version__,
    }
    dev_figs = {**c.figures, "trial": c.number, "within_max_drop": out.within_max_drop}
    default = f"tuned-{spec.task}-{spec.model.rstrip('/').split('/')[-1]}"
    return PresetFile(name or default, dict(c.settings), tuned_on, dev_figs, out.ar.to_dict())


__all__ = [
    "TuneOutcome",
    "TuneSpec",
    "ar_figures",
    "build_preset",
    "make_objective",
    "open_study",
    "run_tune",
]
