"""The DVC stages: one module per stage, each the one place that opens the stage's run, resolves its paths
and calls the library.

- :mod:`qac.stages.prepare` (``prepare@<dataset>``), :mod:`qac.stages.split_passages`,
  :mod:`qac.stages.word_frequencies`;
- :mod:`qac.stages.query_generator` (the doc2query generator, trained or saved), :mod:`qac.stages.generate_queries`,
  :mod:`qac.stages.generate_continuations`, and :mod:`qac.stages.generation`, the sharded, resumable skeleton the
  generation stages share; :mod:`qac.stages.llm_queries` (``generate_llm_queries``, ``filter_llm_queries``);
- :mod:`qac.stages.pretrain` (``pretrain@<variant>``), :mod:`qac.stages.pretrain_llm`;
- :mod:`qac.stages.bm25`, :mod:`qac.stages.finetune` (``finetune@<variant>``), :mod:`qac.stages.evaluate`
  (``evaluate@<variant>``), :mod:`qac.stages.beir_retriever`, :mod:`qac.stages.reference`,
  :mod:`qac.stages.annotation`;
- :mod:`qac.stages.arguments`: a stage's command line.

They sit above the library's rooms, which they combine, so those rooms stay below (tests/test_architecture.py).
The scripts in ``pipelines/`` are what DVC runs: each parses nothing itself and calls its stage.
"""
