"""DVC stage ``pretrain@<variant>``: pre-train (or, for method none, export) one encoder.

Writes ``data/<profile>/pretrain/<variant>/`` as one unit: ``encoder/`` (the
Hugging Face folder fine-tuning starts from), ``checkpoint/`` (everything
needed to resume) and ``mlflow_run.json``. The in-progress checkpoint lives in
``data/<profile>/.work/pretrain/<variant>/``, which DVC does not delete, so a
rerun after an interruption resumes. Runs alone or under ``torchrun``.
The MLflow run is ``<method> · <context> · C=<count> · pretrain``; with
``--log-models`` (or ``mlflow.log_models``) the encoder is logged as its artifact.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def result_facts(summary: dict) -> list[str]:
    """The summary line's facts: steps and final loss, or what method none did."""
    if summary.get("method") == "none":
        return ["no pre-training (start encoder exported)"]
    facts = [f"{summary['steps']} steps"]
    if summary.get("resumed_from_step"):
        facts.append(f"resumed at step {summary['resumed_from_step']}")
    loss = (summary.get("final_metrics") or {}).get("loss")
    if loss is not None:
        facts.append(f"final loss {loss:.3f}")
    return facts


def main(argv: list[str] | None = None) -> None:
    from qac.console import StageClock, add_verbose_flag, print_summary, setup_console

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", required=True, help="a key of pretrain.variants")
    parser.add_argument("--log-models", action="store_true",
                        help="log the encoder to MLflow as an artifact (also mlflow.log_models in params)")
    args = add_verbose_flag(parser).parse_args(argv)
    setup_console(args.verbose)
    clock = StageClock()

    from qac.config import load_params, profile_dir
    from qac.distributed import cleanup, init_distributed
    from qac.io import atomic_path, path_md5
    from qac.tracking import log_metrics, stage_run, write_run_record
    from qac.tracking.naming import variant_description, variant_run_name
    from qac.tracking.record import log_encoder, log_file_input, models_requested
    from qac.train.pretrain import PretrainSettings, pretrain

    params = load_params()
    settings = PretrainSettings.from_params(params, args.variant)
    description = variant_description(params, args.variant)
    root = profile_dir(params)
    out_dir = root / "pretrain" / args.variant
    work_dir = root / ".work" / "pretrain" / args.variant
    inputs = {"passages": root / "passages.jsonl", "queries": root / "queries.jsonl"}
    queries = inputs["queries"] if settings.context_type in ("query", "mixed") else None

    def log_step(step: int, metrics: dict[str, float]) -> None:
        log_metrics(metrics, step=step)

    dist = init_distributed()
    tags = {"qac.variant": args.variant, "qac.method": settings.method,
            "qac.context_type": settings.context_type if settings.method != "none" else "none",
            "qac.query_count": settings.query_count if settings.method != "none" else 0,
            "qac.cotmae_decoder": settings.cotmae_decoder if settings.method == "cotmae" else "none"}
    stage = f"pretrain@{args.variant}"
    tracked = (stage_run(params, stage, variant_run_name(description, "pretrain"), kind="pretrain",
                         stage_params={**settings.to_dict(), **description}, inputs=inputs, tags=tags)
               if dist.is_main else contextlib.nullcontext())
    # Only the main process writes the output folder, as one atomic unit.
    output = atomic_path(out_dir, directory=True) if dist.is_main else contextlib.nullcontext(out_dir)
    try:
        with tracked as run, output as staging:
            staging = Path(staging)
            if dist.is_main and settings.method != "none":
                log_file_input(inputs["passages"], "passages", "training")
                if queries is not None:
                    log_file_input(queries, "generated-queries", "training")
            summary = pretrain(settings, passages=inputs["passages"], queries=queries, work_dir=work_dir,
                               out_dir=staging, log=log_step if dist.is_main else None)
            if dist.is_main:
                import mlflow

                outputs = {"encoder": staging / "encoder", "checkpoint": staging / "checkpoint"}
                record = {"variant": args.variant, "method": settings.method}
                for name, path in outputs.items():
                    if path.exists():
                        final = out_dir / name
                        mlflow.set_tags({f"qac.{name}": str(final), f"qac.{name}_md5": path_md5(path)})
                        record[f"{name}_md5"] = path_md5(path)
                mlflow.log_dict(summary, "pretrain_summary.json")
                if models_requested(params, args.log_models):
                    log_encoder(outputs["encoder"], "encoder")
                write_run_record(staging, run.info.run_id, **record)
    finally:
        cleanup()
    print_summary(stage, *result_facts(summary), seconds=clock.seconds)


if __name__ == "__main__":
    main()
