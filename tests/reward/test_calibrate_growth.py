"""Growth-penalty calibration from recorded OPD bank sizes: golden values worked by hand, the rows it
must skip, the errors it must raise, and the CLI."""

import json
import random

import pytest

from reward.bank_sizes import BANK_SIZES_FILE, load_rows
from reward.calibrate_growth import calibrate, main, to_yaml, write_pairs
from reward.scoring import GrowthBounds, ScoringConfig


def _row(tid, sizes, statuses=None, parent=0, harness="native", status="ok"):
    return {
        "step": 1,
        "trajectory_id": tid,
        "harness": harness,
        "sequence_id": "s",
        "window_index": 0,
        "status": status,
        "parent_size_tokens": parent,
        "size_tokens": sizes,
        "chunk_status": statuses or ["ok"] * len(sizes),
    }


def _write(run, rows, tail=""):
    run.mkdir(parents=True, exist_ok=True)
    (run / BANK_SIZES_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


ROWS = [
    _row("a", [10, 15]),  # (0,10) (10,15)
    _row("b", [10, 30]),  # (0,10) (10,30)
    _row("c", [12, 12]),  # (0,12) (12,12)
    _row("d", [5, 9], ["policy_error", "ok"]),  # the malformed chunk is skipped, its size carried: (5,9)
    _row("e", [7, None], ["ok", "platform_error"]),  # (0,7), then stops at the fault
    _row("f", [50, 60], status="platform_error"),  # a platform-failed rollout: nothing
    _row("g", [40], parent=20, harness="mem0"),  # another harness
]


def test_pairs_skip_malformed_and_faulted_chunks():
    p = write_pairs(ROWS)
    assert p["native"] == [(0, 10), (10, 15), (0, 10), (10, 30), (0, 12), (12, 12), (5, 9), (0, 7)]
    assert p["mem0"] == [(20, 40)]


def test_golden_bounds_worked_by_hand():
    rows = [r for r in ROWS if r["trajectory_id"] in "abc"]
    c = calibrate(rows, lower_q=0.5, upper_q=0.9, min_writes=6)["native"]
    # floor = median first write of [10, 10, 12] = 10; g = 10/10, 15/10, 10/10, 30/10, 12/10, 12/12
    # sorted [1, 1, 1, 1.2, 1.5, 3]: p50 = (1 + 1.2)/2 = 1.1; p90 at index 4.5 = (1.5 + 3)/2 = 2.25
    assert c.floor_tokens == 10 and c.num_writes == 6 and c.num_first_writes == 3
    assert c.lower == pytest.approx(1.1) and c.upper == pytest.approx(2.25)
    assert c.share_penalised == pytest.approx(3 / 6) and c.share_full == pytest.approx(1 / 6)
    assert c.overrides() == [
        "reward.scoring.growth_bounds.native.lower=1.1",
        "reward.scoring.growth_bounds.native.upper=2.25",
        "reward.scoring.growth_bounds.native.floor_tokens=10",
    ]
    # a fixed floor: sorted g = [.5, .5, .6, .6, .75, 1.5]: p50 = 0.6 -> l_h = 1; p99 = .75 + .95 * .75
    fixed = calibrate(rows, lower_q=0.5, upper_q=0.99, floor_tokens=20, min_writes=6)["native"]
    assert (
        fixed.floor_tokens == 20 and fixed.lower == 1.0 and fixed.upper == 1.463
    )  # 1.4625, kept to the 4 significant digits it is printed with
    # the YAML the CLI writes loads into the reward config as valid bounds
    import yaml

    gb = yaml.safe_load(to_yaml({"native": c}))["growth_bounds"]
    ScoringConfig(growth_bounds={h: GrowthBounds(**b) for h, b in gb.items()}).validate()
    assert gb["native"] == {"lower": 1.1, "upper": 2.25, "floor_tokens": 10}


def test_errors_are_clear():
    with pytest.raises(ValueError, match="need >= 50"):
        calibrate(ROWS)
    flat = [_row(str(i), [10, 10, 10]) for i in range(30)]  # the bank never grows after its first write
    with pytest.raises(ValueError, match="barely grow"):
        calibrate(flat, min_writes=10)
    # bounds that differ only past the 4 significant digits the overrides print are "no spread" too
    tiny = [_row(str(i), [100_001 + i % 10]) for i in range(60)]
    with pytest.raises(ValueError, match="barely grow"):
        calibrate(tiny, floor_tokens=100_000, min_writes=10)
    with pytest.raises(ValueError, match="no write ever grew"):
        calibrate([_row(str(i), [0, 0]) for i in range(30)], min_writes=10)
    with pytest.raises(ValueError, match="no valid writes"):
        calibrate([_row("x", [0], ["policy_error"])], min_writes=0)
    with pytest.raises(ValueError, match="2 sizes for 1 chunks"):
        write_pairs([_row("x", [1, 2], ["ok"])])
    with pytest.raises(ValueError, match="lower_q < upper_q"):
        calibrate(ROWS, lower_q=0.9, upper_q=0.5)


def test_load_rows_dedups_resumed_steps_and_tolerates_only_a_truncated_tail(tmp_path, caplog):
    run = tmp_path / "opd"
    # a resumed step records its rollouts again: the last line per trajectory wins
    _write(run, [_row("a", [1, 2]), _row("b", [3]), _row("a", [10, 15])], tail='{"step": 2, "traj')
    rows = load_rows([run])
    assert sorted((r["trajectory_id"], r["size_tokens"][-1]) for r in rows) == [("a", 15), ("b", 3)]
    assert "truncated last line" in caplog.text
    _write(run, [_row("a", [1])], tail='{"broken\n' + json.dumps(_row("b", [2])) + "\n")
    with pytest.raises(ValueError, match=r":2: not a JSON line"):
        load_rows([run])
    _write(run, [{"trajectory_id": "a"}])
    with pytest.raises(ValueError, match="missing"):
        load_rows([run])
    with pytest.raises(FileNotFoundError, match="no bank sizes recorded"):
        load_rows([tmp_path / "nowhere"])


def test_cli_prints_table_and_overrides_and_writes_yaml(tmp_path, capsys):
    rnd = random.Random(0)
    rows = []
    for i in range(40):  # 40 rollouts x 3 chunks of steady, noisy growth
        sizes, b = [], 0
        for _ in range(3):
            b += rnd.randint(8, 24)
            sizes.append(b)
        rows.append(_row(f"t{i}", sizes))
    _write(tmp_path / "run", rows)
    out = tmp_path / "bounds.yaml"
    assert main([str(tmp_path / "run"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "native" in text and "reward.scoring.growth_bounds.native.floor_tokens=" in text
    assert out.read_text().startswith("# python -m reward.calibrate_growth")
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "no bank sizes recorded" in capsys.readouterr().err
    assert main([str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["native"]["num_writes"] == 120
