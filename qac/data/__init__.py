"""Datasets and passages: reading, checking, preparing and splitting.

- ``dataset``: the in-memory types (``Document``, ``Dataset``) every reader returns;
- ``errors``: ``DataFormatError`` (file, line, field) and ``DatasetUnavailableError``;
- ``beir``, ``msmarco``, ``trec``, ``hub``: readers of the distributed formats;
- ``sources``: where a dataset declared in ``params.yaml`` comes from (mirror, download);
- ``prepared``: the normalised dataset folder of the ``prepare`` stage (``load_prepared``);
- ``punkt``, ``splitting``: sentences and passages for pre-training (``split_passages``);
- ``context_pairs``, ``masking``: pre-training pairs and masking.
"""
