"""qac: query-as-context pre-training of dense passage retrievers, reproducibly."""

__version__ = "0.1.0"
