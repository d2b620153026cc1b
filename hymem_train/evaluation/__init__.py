"""The writer-only swap matrix (`python -m hymem_train.evaluate`; docs/evaluation.md)."""
