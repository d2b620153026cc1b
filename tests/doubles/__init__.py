"""Test doubles shared by the test suite (and one shipped benchmark), kept out of the production packages.

    openai_server.py  StandInServer: a stand-in OpenAI-compatible server (chat + embeddings, scripted
                      replies, per-key checks, request record). Also used by the shipped benchmark
                      benchmarks/bench_harness_fork.py.
    annotator.py      a scripted data-pipeline annotator (PRM / ORM answers) for StandInServer
    reward_window.py  a 2-chunk window on native banks and scripted reader / judge replies (reward tests)

Import them as `tests.doubles.<module>`: pytest puts the repo root on sys.path (pyproject.toml
`pythonpath`), and the benchmark inserts it itself.
"""
