"""Stage `split_passages`: the pre-training corpus cut into passages of at most `split.max_len` tokens.

Reads data/<profile>/datasets/<pretrain_corpus>/corpus.jsonl, writes
data/<profile>/passages.arrow, data/<profile>/punkt/ (the Punkt model used) and
data/<profile>/metrics/split.json. Logs the MLflow run `split_passages`.
"""

from __future__ import annotations

import time

from qac.config import profile_dir
from qac.params import load_params
from qac.stages.arguments import stage_arguments
from qac.console import StageClock, print_summary
from qac.data.punkt import PunktUnavailableError, download_pretrained_english, pretrained_english_available
from qac.data.splitting import SplitSettings, split_corpus_file
from qac.reporting.dvc_metrics import write_stage_metrics
from qac.tracking.lifecycle import tracked_stage


def main(argv: list[str] | None = None) -> int:
    stage_arguments(__doc__.splitlines()[0], argv)
    clock = StageClock()
    params = load_params()
    settings = SplitSettings.from_params(params)
    split = params.split
    data = profile_dir(params)
    corpus = data / "datasets" / params.pretrain_corpus / "corpus.jsonl"
    if not corpus.is_file():
        raise SystemExit(f"{corpus}: not found; run the prepare stage for {params.pretrain_corpus!r} first")
    passages = data / "passages.arrow"
    if split.punkt == "pretrained" and not pretrained_english_available():
        try:   # NLTK's own downloader, before any work; a clear paragraph when there is no network
            download_pretrained_english()
        except PunktUnavailableError as error:
            raise SystemExit(str(error)) from None

    with tracked_stage(params, "split_passages", "split_passages", kind="split",
                       stage_params={"split": split, "seed": params.seed, "pretrain_corpus": params.pretrain_corpus},
                       inputs={"corpus": corpus}, tags={"qac.tokenizer": split.tokenizer}) as tracking:
        tracking.log_file_inputs({f"{params.pretrain_corpus}/corpus": corpus}, "splitting",
                                 columns=("_id", "title", "text"))
        started = time.perf_counter()
        stats, punkt_model = split_corpus_file(
            corpus, passages, data / "punkt", tokenizer_spec=split.tokenizer, settings=settings,
            punkt=split.punkt, punkt_train_documents=split.punkt_train_documents, workers=split.workers,
            chunk_size=split.chunk_size, max_documents=split.max_documents)
        seconds = time.perf_counter() - started
        tracking.set_tags({"qac.punkt": punkt_model})
        metrics = {**stats.as_metrics(), "seconds": seconds,
                   "documents_per_second": stats.documents / seconds if seconds else 0.0}
        tracking.log_metrics(metrics)
        write_stage_metrics(data / "metrics", "split", {**metrics, "punkt": punkt_model})
    print_summary("split_passages", f"{stats.documents} documents -> {stats.passages} passages",
                  f"mean {metrics['mean_tokens']:.1f}, max {stats.max_tokens} tokens",
                  f"{stats.sentences} sentences", f"Punkt {punkt_model}", seconds=clock.seconds)
    return 0

