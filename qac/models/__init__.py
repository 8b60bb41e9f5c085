"""Model loading, pre-training models (coCondenser, CoT-MAE) and their losses."""
