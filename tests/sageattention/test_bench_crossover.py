"""sageattention.bench.crossover's grid, crossover rule and report (no GPU needed)."""
from __future__ import annotations

from sageattention.bench import crossover


def row(d, causal, batch, n, sage, sdpa):
    return dict(batch=batch, b=1, h=16, n=n, d=d, causal=causal, tops={"sageattn": sage, "sdpa": sdpa})


def test_the_grid_follows_the_fa3_protocol_and_one_sequence():
    shapes = list(crossover.shapes())
    assert len(shapes) == 2 * 2 * len(crossover.KEYS) * 2
    for s in shapes:
        if s["batch"] == "fa3":
            assert s["b"] == max(1, 16384 // s["n"])  # about 16k tokens per batch
            assert s["h"] * s["d"] == 2048
        else:
            assert s["b"] == 1 and s["h"] == (24 if s["d"] == 128 else 20)


def test_the_crossover_is_where_every_longer_row_wins():
    rows = [row(128, False, b, n, sage, 500) for b in ("fa3", "one sequence")
            for n, sage in ((1024, 300), (2048, 520), (4096, 480 if b == "fa3" else 510), (8192, 600), (16384, 700))]
    rows += [row(128, True, "fa3", n, sage, 500) for n, sage in ((1024, 480), (2048, 490), (4096, 486))]
    rows += [row(64, True, "fa3", n, 100, 200) for n in (1024, 4096)]
    rows += [row(64, False, "fa3", 1024, None, 200), row(64, False, "fa3", 2048, 300, 200)]
    # 2048 wins on both but 4096 loses by 4 % on one: the crossover is 8192; within 3 % (490, 486 of 500) counts as
    # not slower; never winning gives None; a failure loses
    assert crossover.crossovers(rows) == {(64, False): 2048, (64, True): None, (128, False): 8192, (128, True): 2048}


def test_markdown_lists_every_row_and_the_crossovers():
    rows = [row(128, False, "fa3", 1024, 300.0, 500.0), row(128, False, "fa3", 4096, 600.0, 500.0)]
    text = crossover.body(dict(meta={}, rows=rows))
    assert "| 128 | no | fa3 | 1 | 16 | 1024 | 300.0 | 500.0 | 0.60 |" in text
    assert "- head_dim 128: 4096" in text
