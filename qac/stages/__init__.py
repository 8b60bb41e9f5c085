"""What a DVC stage runs when it joins several rooms of the library: one function per stage.

- :mod:`qac.stages.retrievers`: evaluating one variant's retrievers (``evaluate@<variant>``);
- :mod:`qac.stages.zero_shot_retriever`: training and evaluating the zero-shot retriever (``beir_retriever``);
- :mod:`qac.stages.bm25_baseline`: the BM25 run, its negatives and the BM25 baseline (``bm25``).

They sit above evaluation, retrieval and training, which they combine, so those rooms stay below
(tests/test_architecture.py). The stage scripts in ``pipelines/`` parse their arguments and call them.
"""
