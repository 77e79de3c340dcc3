"""sageattention/bench/item_costs.py's arithmetic (no GPU): a tile's time and an item's cost besides its tiles, recovered from
launch times made up of known parts, and the tables written from them."""
from __future__ import annotations

from sageattention.bench import item_costs


def made_up_rows(launch: float, tile: dict, item: dict) -> list[dict]:
    """Times of launch + k * (item[d](n) + n * tile[d]), for every shape item_costs measures."""
    return [dict(d=d, items_per_program=k, tiles=n, us=launch + k * (item[d](n) + n * tile[d]))
            for d in (128, 64) for k in item_costs.ITEMS_PER_PROGRAM for n in item_costs.TILES]


def test_derive_recovers_the_parts():
    tile = {128: 1.25, 64: 0.75}
    # a short item's boundary costs more; from 16 tiles on the same (what the tile's time is derived from)
    item = {128: lambda n: 3.0 + (4.0 / n if n < 16 else 0.0), 64: lambda n: 2.0}
    derived = item_costs.derive(made_up_rows(9.0, tile, item))
    for d in (128, 64):
        assert abs(derived[d]["tile_us"] - tile[d]) < 1e-9
        for n in item_costs.TILES:
            assert abs(derived[d]["item_us"][n] - item[d](n)) < 1e-9, (d, n)


def test_markdown_holds_every_time_and_the_derived_costs():
    rows = made_up_rows(9.0, {128: 1.25, 64: 0.75}, {128: lambda n: 3.0, 64: lambda n: 2.0})
    text = item_costs.body(dict(meta={}, rows=rows))
    assert "| 128 | 4 | " in text and "| 64 | 1 | " in text
    assert f"{rows[-1]['us']:.1f}" in text
    assert "| 128 | 1.25 | 3.0, 3.0" in text and "| 64 | 0.75 | 2.0" in text
