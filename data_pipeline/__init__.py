"""Reward and evaluation data.

    schema.py            canonical, versioned records + HF Features (Sequence, Chunk, Window, Probe, ...)
    loaders.py           LoCoMo / LongMemEval original layouts, generic JSONL -> Sequences + EvalItems
    chunking.py          chunks (session / token budget), windows (<= 5 chunks), the seeded eval subsample
    synthetic.py         synthetic streams with gold facts, probes, traps and ORM questions by construction
    annotate.py          PRM and ORM annotation passes through an OpenAI-compatible annotator (cached)
    stats.py             the report's statistics table per harness configuration
    store.py             datasets on disk (atomic writes), BuiltDataset reader
    build.py             `python -m data_pipeline.build` (configs/data_build.yaml + configs/data/); judge
                         validation is injected from reward (`python -m reward.judge_validation`)
    typed_config.py      typed Hydra mechanics: compose, to_typed, ConfigError (re-exported by hymem_train.config)

See docs/data.md.
"""
