"""Evaluation: trec_eval-compatible metrics, significance tests, run and qrels files.

- :mod:`qac.evaluation.metrics`: ``evaluate(qrels, run, measures, rel_threshold, ignore_identical_ids)``
  with trec_eval semantics (the module docstring states every convention);
- :mod:`qac.evaluation.significance`: paired randomization test (used by the tables) and paired t-test;
- :mod:`qac.evaluation.trec_io`: TREC runs, TREC and BEIR qrels;
- :mod:`qac.evaluation.split_evaluation`: evaluate a run on a dataset split and log it to MLflow.
"""
