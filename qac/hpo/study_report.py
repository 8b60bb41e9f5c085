"""What a study found: the best trial, every trial's state, and Optuna's figures.

``write_study_report`` writes, into one folder (replaced atomically):

- ``summary.json`` / ``summary.md``: the best trial (value, parameters,
  retry of which trial), the count of trials per state. Trials that reach the
  best value exactly are a tie (``best.tied_with``): the report names them all
  and calls none of them the best;
- ``trials.csv``: one row per trial (Optuna's trials data frame);
- ``optimization_history.png``, ``intermediate_values.png``,
  ``param_importances.png``: ``optuna.visualization.matplotlib`` figures.
  Importances need at least ``MIN_TRIALS_FOR_IMPORTANCE`` complete trials whose
  parameters vary and whose values differ; otherwise the summary says why the
  figure is missing (equal importances of equal values would explain nothing).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

from qac.io import atomic_path, write_json
from qac.tracking import metric_key, tracking_uri

MIN_TRIALS_FOR_IMPORTANCE = 3


def study_summary(study, metric: str) -> dict[str, Any]:
    """Counts per state and the best trial, as plain data."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    counts = {state.name.lower(): 0 for state in TrialState}
    for trial in trials:
        counts[trial.state.name.lower()] += 1
    summary: dict[str, Any] = {
        "study": study.study_name,
        "direction": study.direction.name.lower(),
        "metric": metric,
        "trials": len(trials),
        "states": counts,
        "best": None,
    }
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete:
        best = study.best_trial
        summary["best"] = {
            "number": best.number,
            "value": best.value,
            "params": best.params,
            "retry_of": best.system_attrs.get("failed_trial"),
            "intermediate_values": {str(step): value for step, value in sorted(best.intermediate_values.items())},
            "duration_seconds": best.duration.total_seconds() if best.duration else None,
            # Equal values are equal: a tie is named as one, whatever order Optuna keeps.
            "tied_with": [t.number for t in complete if t.value == best.value and t.number != best.number],
        }
    return summary


def summary_markdown(summary: dict[str, Any], figures: dict[str, str]) -> str:
    lines = [f"# Study `{summary['study']}`", "",
             f"Objective: dev {summary['metric']} ({summary['direction']}), {summary['trials']} trials: "
             + ", ".join(f"{count} {state}" for state, count in summary["states"].items() if count) + ".", ""]
    best = summary["best"]
    if best is None:
        lines.append("No trial has completed yet.")
    else:
        retry = f" (retry of trial {best['retry_of']})" if best["retry_of"] is not None else ""
        tied = best.get("tied_with") or []
        if tied:
            numbers = ", ".join(str(n) for n in sorted([best["number"], *tied]))
            lines += [f"Tie: trials {numbers} all reach {summary['metric']} = {best['value']:.4f}; none is better. "
                      f"Parameters of trial {best['number']}{retry}:", "", "| parameter | value |", "|---|---|"]
        else:
            lines += [f"Best: trial {best['number']}{retry}, {summary['metric']} = {best['value']:.4f}.", "",
                      "| parameter | value |", "|---|---|"]
        lines += [f"| `{key}` | {_format(value)} |" for key, value in best["params"].items()]
    lines += ["", "## Figures", ""]
    for name, status in figures.items():
        lines.append(f"![{name}]({name}.png)" if status == "written" else f"- {name}: not drawn ({status})")
    return "\n".join(lines) + "\n"


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _complete_with_varying_params(study) -> tuple[int, bool, bool]:
    """Complete trials, whether their parameters vary, and whether their values do."""
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    varying = any(len({repr(t.params.get(key)) for t in complete}) > 1
                  for key in {key for t in complete for key in t.params})
    return len(complete), varying, len({t.value for t in complete}) > 1


def draw_figures(study, out_dir: Path) -> dict[str, str]:
    """Draw Optuna's figures into ``out_dir``; returns figure name -> 'written' or why it was skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as optuna_plots

    n_complete, varying, values_differ = _complete_with_varying_params(study)
    any_intermediate = any(t.intermediate_values for t in study.get_trials(deepcopy=False))
    plans = {
        "optimization_history": (optuna_plots.plot_optimization_history,
                                 None if n_complete else "no complete trial"),
        "intermediate_values": (optuna_plots.plot_intermediate_values,
                                None if any_intermediate else "no trial reported an intermediate value"),
        "param_importances": (optuna_plots.plot_param_importances,
                              None if n_complete >= MIN_TRIALS_FOR_IMPORTANCE and varying and values_differ else
                              f"needs {MIN_TRIALS_FOR_IMPORTANCE} complete trials whose parameters vary and whose "
                              f"values differ; has {n_complete} complete, parameters "
                              f"{'vary' if varying else 'all equal'}, values "
                              f"{'differ' if values_differ else 'all tie'}"),
    }
    status: dict[str, str] = {}
    for name, (plot, skip_reason) in plans.items():
        if skip_reason:
            status[name] = skip_reason
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            try:
                axes = plot(study)
            except (ValueError, RuntimeError) as error:  # e.g. importances of constant objectives
                status[name] = f"Optuna could not draw it: {error}"
                continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        figure.tight_layout()
        figure.savefig(out_dir / f"{name}.png", dpi=120)
        plt.close(figure)
        status[name] = "written"
    return status


def write_study_report(study, metric: str, out_dir: str | Path) -> dict[str, Any]:
    """Write summary, trial table and figures into ``out_dir`` (replaced as a whole); returns the summary."""
    summary = study_summary(study, metric)
    with atomic_path(out_dir, directory=True) as tmp:
        figures = draw_figures(study, tmp)
        summary["figures"] = figures
        frame = study.trials_dataframe()
        frame.to_csv(tmp / "trials.csv", index=False)
        write_json(tmp / "summary.json", _json_safe(summary))
        (tmp / "summary.md").write_text(summary_markdown(summary, figures), encoding="utf-8")
    return summary


def _json_safe(value: Any) -> Any:
    """NaN and infinities become null (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def log_report_to_mlflow(run_id: str, summary: dict[str, Any], report_dir: str | Path) -> None:
    """Attach the report to the study's MLflow run, with the best value and the state counts as metrics."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri())
    for state, count in summary["states"].items():
        client.log_metric(run_id, f"trials/{state}", count)
    if summary["best"] is not None:
        client.log_metric(run_id, metric_key("best", summary["metric"]), summary["best"]["value"])
        tied = summary["best"].get("tied_with") or []
        client.set_tag(run_id, "qac.best_trial", str(summary["best"]["number"]) if not tied else
                       "tie: " + ",".join(str(n) for n in sorted([summary["best"]["number"], *tied])))
    client.log_artifacts(run_id, str(report_dir), artifact_path="hpo_report")
