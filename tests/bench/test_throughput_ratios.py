"""bench-batch's measurement order (a stride that changes each repeat) and its auto / best fixed
figures (issue 50): read off one run, with the best fixed configuration named."""

from __future__ import annotations

from s2d2.bench.throughput import cell_order, pick_configs
from s2d2.bench.throughput_table import auto_vs_best_fixed, is_auto, render_ratios


def test_every_configuration_follows_different_ones_across_repeats():
    k = 7
    for li in range(4):
        orders = [cell_order(r, li, k) for r in range(3)]
        assert all(sorted(o) == list(range(k)) for o in orders)
        assert orders == [cell_order(r, li, k) for r in range(3)]  # a rerun runs the same order
        for j in range(k):  # what ran just before configuration j: not the same in all three repeats
            before = {o[o.index(j) - 1] if o.index(j) else None for o in orders}
            assert len(before) > 1, (li, j, orders)


def _row(name: str, limit: int, tps: float, **extra) -> dict:
    return {"config": name, "max_num_seqs": limit, "prefix_cache": True, "tokens_per_s": tps, **extra}


def test_auto_over_the_best_fixed_configuration_at_each_limit():
    rows = [
        _row("ar", 1, 400.0), _row("lossless-b8", 1, 1000.0), _row("lossless-auto", 1, 990.0),
        _row("ar", 64, 3000.0), _row("lossless-b4", 64, 3500.0), _row("lossless-b8", 64, 3400.0),
        _row("lossless-auto", 64, 3600.0),
    ]  # fmt: skip
    out = auto_vs_best_fixed(rows, ["lossless-auto"])
    assert [(e["max_num_seqs"], e["best_fixed"], e["ratio"]) for e in out] == [
        (1, "lossless-b8", 0.99),
        (64, "lossless-b4", round(3600 / 3500, 3)),
    ]
    assert out[1]["auto"] == 3600.0 and out[1]["best_fixed_value"] == 3500.0
    assert out[0]["figure"] == "tokens_per_s"
    assert render_ratios({"auto_vs_best_fixed": out}) == [
        "lossless-auto / best fixed (tokens_per_s): 1 rows 0.990 (lossless-b8), 64 rows 1.029 (lossless-b4)"
    ]


def test_projected_figures_and_other_auto_configurations_are_compared_apart():
    rows = [
        _row("ar", 8, 100.0, projected_forward_tokens_per_s=2000.0),
        _row("lossless-b16", 8, 90.0, projected_forward_tokens_per_s=4700.0),
        _row("lossless-auto", 8, 95.0, projected_forward_tokens_per_s=4723.0),
        _row("lossless-auto-b4", 8, 120.0, projected_forward_tokens_per_s=9000.0),
    ]
    out = auto_vs_best_fixed(rows, ["lossless-auto", "lossless-auto-b4"])
    mine = {(e["config"], e["figure"]): (e["best_fixed"], e["ratio"]) for e in out}
    # another auto configuration is never "the best fixed": only ar and lossless-b16 are
    assert mine[("lossless-auto", "tokens_per_s")] == ("ar", 0.95)
    projected = mine[("lossless-auto", "projected_forward_tokens_per_s")]
    assert projected == ("lossless-b16", round(4723 / 4700, 3))
    assert mine[("lossless-auto-b4", "tokens_per_s")] == ("ar", 1.2)
    assert ("lossless-auto", "projected_tokens_per_s") not in mine  # no such figure in the rows
    assert ("lossless-auto", "fastest_tokens_per_s") not in mine


def test_which_configurations_choose_by_load():
    cfgs = {c.name: c for c in pick_configs(["ar", "lossless-b8", "lossless-fused-b8", "lossless-auto"])}
    assert [n for n, c in cfgs.items() if is_auto(c)] == ["lossless-auto"]


def _cell(seconds: float) -> dict:
    counts = dict(tokens=1000, forwards=100, rows=100, query_tokens=3000, host_syncs_per_step=1.0)
    times = dict(forward_ms_per_step=1.0, other_ms_per_step=0.1, predicted_ms_per_step=None)
    plan = dict(plan_rows=0, plan_fixed_choices=0, plan_admissions={})
    memory = dict(prefill_forwards_per_request=0, prefix_hit_rate=0.0, preemptions=0)
    return {"seconds": seconds, **counts, **times, **plan, **memory}


def test_the_rows_carry_the_median_and_the_fastest_repeat():
    from s2d2.bench.throughput_table import summarize

    cfgs = pick_configs(["ar"])
    out = summarize(cfgs, [4], {(0, 0, 0): [_cell(2.0), _cell(1.0), _cell(4.0)]}, 1e4, 1.0, 8, 16, 3, [True])
    row = out["rows"][0]
    assert row["tokens_per_s"] == 500.0 and row["fastest_tokens_per_s"] == 1000.0
