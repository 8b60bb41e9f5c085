"""The generator's quality as a small Markdown table, from the stage's metrics (one place for its wording)."""

from __future__ import annotations

from typing import Mapping

# (metric key, label, target the default study needs or "")
_ROWS = (
    ("query/rougeL", "ROUGE-L vs held-out real queries (SciFact claims)", ">= 0.20"),
    ("query/rougeL_se", "its standard error over held-out claims", ""),
    ("query/rougeL_greedy", "ROUGE-L vs held-out real queries, greedy query (the model's most likely)", ""),
    ("query/rougeL_first_sentence", "ROUGE-L vs held-out real queries, the source's first sentence", ""),
    ("title/rougeL", "ROUGE-L vs held-out titles", ""),
    ("self_retrieval/generated/top10", "BM25 self-retrieval @10, generated queries", ">= 0.50"),
    ("self_retrieval/generated/top1", "BM25 self-retrieval @1, generated queries", ""),
    ("self_retrieval/random_sentence/top10", "BM25 self-retrieval @10, a random sentence of the source", ""),
    ("self_retrieval/reference/top10", "BM25 self-retrieval @10, the held-out reference", ""),
    ("empty_share", "empty candidates (share)", ""),
    ("duplicate_share", "duplicate candidates (share)", ""),
    ("judge/high_share/passage-query", "Table 5 judge: high correlation, passage-query pairs (one random passage "
     "of each held-out document, its first query)", ">= passage-passage"),
    ("judge/high_share/passage-passage", "Table 5 judge: high correlation, passage-passage pairs (the same passage "
     "and another random passage of its document)", ""),
    ("judge/difference", "Table 5 judge: passage-query minus passage-passage share", ""),
    ("judge/difference/p_value", "its p-value (paired randomization test by document)", ""),
    ("judge/difference/mde", "the smallest difference the anchors could detect (p < 0.05, power 0.8)", ""),
    ("judge/high_share/passage-query/all_candidates",
     "Table 5 judge: high correlation, passage-query pairs, every candidate of each anchor", ""),
    ("judge/mean_score/passage-query/all_candidates", "Table 5 judge: mean cosine, passage-query pairs (every candidate)",
     ""),
    ("judge/mean_score/passage-passage", "Table 5 judge: mean cosine, passage-passage pairs", ""),
    ("judge/threshold", "Table 5 judge: threshold (cosine, calibrated on relevant vs random training pairs)", ""),
    ("train_seconds", "training time (s)", ""),
    ("quality_seconds", "quality measurement time (s)", ""),
)


def quality_table(metrics: Mapping[str, object], title: str) -> str:
    """``| measure | value | target |`` rows for the metrics present, then the counts behind them."""
    lines = [f"# {title}", "", "| measure | value | target |", "|---|---|---|"]
    for key, label, target in _ROWS:
        if key in metrics:
            value = metrics[key]
            shown = f"{value:.3f}" if isinstance(value, float) and not key.endswith("seconds") else f"{value:.0f}" \
                if isinstance(value, float) else str(value)
            lines.append(f"| {label} | {shown} | {target} |")
    counts = ", ".join(f"{key} {metrics[key]:.0f}" for key in ("pairs/train", "pairs/validation", "pairs/heldout",
                                                                 "candidates", "judge/anchors", "train/steps")
                       if key in metrics)
    lines += ["", f"Counts: {counts}." if counts else "",
              f"Generator: {metrics.get('architecture', metrics.get('mode', ''))} from {metrics.get('model', '')}; "
              f"candidates sampled as in generate_queries (top-k/top-p, temperature, seeded per passage)."]
    return "\n".join(lines).rstrip() + "\n"
