"""Stage.close: what an entry point started for the stage (the OPD teacher's replicas, RL's reward
service and frozen servers) is stopped by it, last first, before the stage's own parts."""

from types import SimpleNamespace

from hymem_train.stage import Stage


def test_close_stops_what_the_entry_point_started_last_first():
    order: list[str] = []
    stage = SimpleNamespace(
        on_close=[lambda: order.append("frozen servers"), lambda: order.append("reward service")],
        collector=None,
        server=SimpleNamespace(stop=lambda: order.append("gateway")),
        engine=None,
        logger=None,
        trainer=SimpleNamespace(close=lambda barrier: order.append(f"trainer barrier={barrier}")),
    )
    Stage.close(stage, failed=True)
    assert order == ["reward service", "frozen servers", "gateway", "trainer barrier=False"]
    assert stage.on_close == []  # a second close stops nothing twice
