"""Money per pool: billing increments, the pools' own prices, rounding and stopped lines, reports by pool and GPU.

Exact math first (pure), then the ledger on both databases (SQLite and a real
PostgreSQL) with real ledger rows, through the fake Slurm of ledger_fakes.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker.amount import cost_micros, parse_money
from broker.config import Settings
from broker.db.ledger_models import Charge
from broker.money import ledger, pricebook
from broker.money.charging import Run, billed_node_s, rounding_s, split_run, stopped_micros
from broker.nodes import sessions as ns
from broker.pools.catalog import BILLING, Billing, parse_pools
from ledger_fakes import ROOT, World, setup_lab

T = datetime(2026, 10, 1, 8, 0, tzinfo=UTC)
HOUR = Billing(*BILLING["hour"])
MINUTE = Billing(*BILLING["minute"])
SECOND = Billing()


# --------------------------------------------------------------------------- the math


@pytest.mark.parametrize(("billing", "up_s", "billed"), [
    (HOUR, 61 * 60, 7_200),  # per started hour
    (HOUR, 3_600, 3_600),
    (HOUR, 1, 3_600),
    (HOUR, 0, 0),
    (SECOND, 3_661, 3_661),  # per second: exact seconds
    (SECOND, 1, 1),
    (MINUTE, 10, 60),  # per minute, 60 s minimum
    (MINUTE, 61, 120),
    (MINUTE, 60, 60),
    (MINUTE, 3_601, 3_660),
    (Billing(180, 180), 61, 180),  # the integration test's short "hour"
    (Billing(180, 180), 181, 360),
    (Billing(60, 600), 601, 660),  # a minimum longer than the increment
    (Billing(60, 600), 30, 600),
])
def test_billed_node_seconds(billing: Billing, up_s: int, billed: int) -> None:
    assert billed_node_s(billing, up_s) == billed
    assert rounding_s(billing, up_s) == billed - up_s


def test_a_stopped_node_costs_its_stopped_price_per_node_hour_exactly() -> None:
    disks = Billing(stopped_price_per_hour="0.05", stopped_bills="EBS volume")
    assert stopped_micros(disks, 7_200) == 100_000
    assert stopped_micros(disks, 1) == 14  # 50_000 / 3600 = 13.9, rounded once
    assert stopped_micros(SECOND, 7_200) == 0  # the provider bills nothing while stopped
    assert stopped_micros(disks, 0) == 0


# --------------------------------------------------------------------------- the price book

POOLS = {
    "lab-a100": {"partition": "owned", "capacity": "owned", "gpu_type": "a100"},
    "res-h100": {"partition": "reserved", "capacity": "reserved", "gpu_type": "h100", "price_per_gpu_hour": "0.40"},
    "spot": {"partition": "spot", "capacity": "spot", "gpu_type": "l4", "price_per_gpu_hour": "1.10",
             "billing": "hour"},
    "ondemand": {"partition": "ondemand", "capacity": "ondemand", "gpu_type": "l4"},
    "bare": {"partition": "bare", "capacity": "spot"},
}


def pooled(settings: Settings, pools: dict[str, Any] | None = None) -> Settings:
    return replace(settings, pools=parse_pools(pools or POOLS, "test"))


def test_the_book_prices_pools_from_the_settings_where_the_table_has_no_row(db_url: str) -> None:
    w = World(db_url)
    setup_lab(w.svc)  # table rows: spot 3.60, ondemand 7.20 from 2026-09-01
    settings = pooled(w.svc.settings)
    with w.svc.sessions() as s:
        table_only = pricebook.load(s, w.svc.settings)  # no catalog: the table alone
        book = pricebook.load(s, settings)
        prices = pricebook.pool_prices(s, settings, T)
        market = pricebook.market_prices(s, settings, T)
        legacy = pricebook.market_prices(s, w.svc.settings, T)
    assert table_only.price_at("owned", "owned", T) is None
    assert book.price_at("owned", "owned", T) == 0  # prepaid: its internal rate, "0" by default
    assert book.price_at("owned", "owned", datetime(1990, 1, 1, tzinfo=UTC)) == 0  # in force from the epoch
    assert book.price_at("reserved", "reserved", T) == 400_000
    assert book.price_at("spot", "spot", T) == 3_600_000  # the table's row wins over the configured 1.10
    assert book.price_at("bare", "spot", T) is None  # neither: stays a MissingPrice
    assert prices == {"lab-a100": 0, "res-h100": 400_000, "spot": 3_600_000, "ondemand": 7_200_000}
    assert market == legacy == {"spot_price_micros": 3_600_000, "ondemand_price_micros": 7_200_000}
    # An owned run: nothing spent, its GPU-hours counted, "saved" against on-demand.
    run = Run(1, 0, T, 1_800, 2, "owned", "owned")
    (line,) = split_run(run, book, ondemand=("ondemand", "ondemand"))
    assert (line.amount_micros, line.ondemand_micros) == (0, 7_200_000)


def test_a_configured_pool_price_applies_where_the_table_has_none(db_url: str) -> None:
    w = World(db_url)
    settings = pooled(w.svc.settings)
    with w.svc.sessions() as s:
        book = pricebook.load(s, settings)
    assert book.price_at("spot", "spot", T) == 1_100_000
    assert book.price_at("ondemand", "ondemand", T) is None


# --------------------------------------------------------------------------- ledger rows per pool


def _lab(db_url: str) -> World:
    w = World(db_url)
    w.svc.settings = pooled(w.svc.settings)
    setup_lab(w.svc, vision_budget=None, climate_budget=None)
    return w


def _run_job(w: World, partition: str, seconds: int, user: str = "alice", gpus: int = 1) -> None:
    sid = w.submit(user=user, partition=partition, gpus=gpus, time="1h",
                   group="climate" if user == "carol" else "vision")["slurm_job_id"]
    w.tick()
    w.slurm.start(sid, node=f"{partition}1")
    w.tick()
    w.advance(seconds)
    w.slurm.finish(sid)
    w.tick()
    w.tick()


def test_every_line_records_pool_gpu_type_and_class_and_reports_by_pool_and_gpu_add_up(db_url: str) -> None:
    w = _lab(db_url)
    _run_job(w, "spot", 600)
    _run_job(w, "ondemand", 300, user="bob", gpus=2)
    _run_job(w, "spot", 120, user="carol")
    with w.svc.tx() as s:  # a line from before the catalog (no pool), and one of a partition of no pool
        for key, part in (("run:9001:0:1", "ondemand"), ("run:9002:0:1", "gone")):
            s.add(Charge(line_key=key, slurm_job_id=int(key.split(":")[1]), run_index=0, job_id=None,
                         attempt_id=None, account="vision", user_name="alice", kind="other", partition=part,
                         capacity="ondemand", node="", tag="useful", period_start=T, period_end=T + timedelta(seconds=10),
                         seconds=10, gpus=1, price_micros=7_200_000, amount_micros=20_000, ondemand_micros=20_000,
                         created_at=T))
        sess, _ = ns.open_session(s, w.svc.settings, node="spot4", partition="spot", capacity="spot", gpus=4,
                                  provider="", source="hook", key="open-spot4", at=T)
        ns.close_session(s, sess, T + timedelta(seconds=61 * 60), "released")
    w.advance(60)
    w.tick()
    lines = w.lines()
    runs = [ln for ln in lines if ln["tag"] == "useful" and ln["slurm_job_id"] < 9000]
    assert {(ln["partition"], ln["pool"], ln["gpu_type"], ln["capacity"]) for ln in runs} == {
        ("spot", "spot", "l4", "spot"), ("ondemand", "ondemand", "l4", "ondemand")}
    with w.svc.sessions() as s:
        from broker.db.ledger_models import LedgerRun
        from sqlalchemy import select

        assert {(r.pool, r.gpu_type) for r in s.execute(select(LedgerRun)).scalars()} == {
            ("spot", "l4"), ("ondemand", "l4")}
    by = {b: w.ops()["report"](ROOT, {"by": b}) for b in ("group", "pool", "gpu", "partition", "user")}
    totals = {b: r["total"]["spend_micros"] for b, r in by.items()}
    assert len(set(totals.values())) == 1 and totals["group"] > 0, totals
    for b, r in by.items():
        assert sum(row["spend_micros"] for row in r["rows"]) == r["total"]["spend_micros"], b
        assert sum(row["gpu_seconds"] for row in r["rows"]) == r["total"]["gpu_seconds"], b
    pools = {row["key"]: row for row in by["pool"]["rows"]}
    assert set(pools) == {"spot", "ondemand", "(partition gone)", "(idle nodes)", "(billing rounding)"}
    assert pools["ondemand"]["lines"] == 2  # its own line and the old one its partition names
    assert set({row["key"] for row in by["gpu"]["rows"]}) == {"l4", "(untyped)", "(idle nodes)",
                                                              "(billing rounding)"}
    # The 61-minute power-up of the hourly spot pool: one rounding line of 59 minutes.
    rounding = [ln for ln in lines if ln["tag"] == "rounding"]
    assert [(ln["node"], ln["seconds"], ln["pool"], ln["amount_micros"]) for ln in rounding] == [
        ("spot4", 59 * 60, "spot", cost_micros(4 * 3_600_000, 59 * 60))]
    # One group's view: the same per-pool sums, to the micro-unit, for what carol may see.
    from ledger_fakes import caller

    carol = {b: w.ops()["report"](caller("carol"), {"by": b}) for b in ("group", "pool", "gpu")}
    assert len({r["total"]["spend_micros"] for r in carol.values()}) == 1
    assert [row["key"] for row in carol["pool"]["rows"]] == ["spot"]


def test_rounding_lands_once_per_power_up_and_only_where_the_pool_bills_increments(db_url: str) -> None:
    w = _lab(db_url)
    with w.svc.tx() as s:
        for node, part, up_s in (("spot1", "spot", 61 * 60), ("spot2", "spot", 3_600), ("od1", "ondemand", 61 * 60)):
            sess, _ = ns.open_session(s, w.svc.settings, node=node, partition=part, capacity=part, gpus=4,
                                      provider="", source="hook", key=f"open-{node}", at=T)
            ns.set_usage(s, sess, "busy", T + timedelta(seconds=60))
            ns.set_usage(s, sess, "idle", T + timedelta(seconds=660))
            ns.close_session(s, sess, T + timedelta(seconds=up_s), "released")
    now = T + timedelta(hours=2)
    first = ledger.charge_rounding(w.svc, now)
    assert ledger.charge_rounding(w.svc, now) == 0  # keyed: it cannot land twice
    assert first == cost_micros(4 * 3_600_000, 59 * 60)
    ledger.charge_idle_stretches(w.svc, now)
    spot1 = [ln for ln in w.lines() if ln["node"] == "spot1"]
    # Node time of the power-up: idle lines + busy stretch + rounding = two whole hours.
    assert sum(ln["seconds"] for ln in spot1) + 600 == 7_200
    assert [ln["tag"] for ln in spot1].count("rounding") == 1
    assert not [ln for ln in w.lines() if ln["node"] in ("spot2", "od1") and ln["tag"] == "rounding"]


def test_a_stopped_node_of_a_pool_whose_provider_keeps_billing_gets_a_stopped_line(db_url: str) -> None:
    pools = dict(POOLS)
    pools["spot"] = dict(POOLS["spot"], stopped_price_per_hour="0.05", stopped_bills="EBS volume")
    w = World(db_url)
    w.svc.settings = pooled(w.svc.settings, pools)
    setup_lab(w.svc)
    with w.svc.tx() as s:
        a, _ = ns.open_session(s, w.svc.settings, node="spot1", partition="spot", capacity="spot", gpus=4,
                               provider="", source="hook", key="open-1", at=T)
        ns.close_session(s, a, T + timedelta(seconds=3_600), "released")
        b, _ = ns.open_session(s, w.svc.settings, node="spot1", partition="spot", capacity="spot", gpus=4,
                               provider="", source="hook", key="open-2", at=T + timedelta(hours=3))
        c, _ = ns.open_session(s, w.svc.settings, node="od1", partition="ondemand", capacity="ondemand", gpus=4,
                               provider="", source="hook", key="open-3", at=T)
        ns.close_session(s, c, T + timedelta(seconds=60), "released")
    now = T + timedelta(hours=3, minutes=1)
    assert ledger.charge_stopped_stretches(w.svc, now) == 100_000  # 2 h stopped at $0.05 per node-hour
    assert ledger.charge_stopped_stretches(w.svc, now) == 0
    (line,) = [ln for ln in w.lines() if ln["tag"] == "stopped"]
    assert (line["node"], line["seconds"], line["pool"], line["price_micros"]) == ("spot1", 7_200, "spot", 50_000)
    rows = {r["key"]: r["spend_micros"] for r in w.ops()["report"](ROOT, {"by": "pool"})["rows"]}
    assert rows["(stopped nodes)"] == 100_000
    assert b.suspended_at is None


def test_prices_can_be_set_for_owned_and_reserved_pools(db_url: str) -> None:
    w = _lab(db_url)
    out = w.ops()["price_set"](ROOT, {"partition": "owned", "capacity": "owned", "price": "0.25",
                                      "effective": "2026-09-01"})
    assert out["added"][0]["capacity"] == "owned"
    with w.svc.sessions() as s:
        assert pricebook.load(s, w.svc.settings).price_at("owned", "owned", T) == 250_000
    assert parse_money("0.25") == 250_000


def test_a_node_session_is_priced_from_the_pools_configured_price(db_url: str) -> None:
    w = _lab(db_url)
    with w.svc.tx() as s:
        owned, _ = ns.open_session(s, w.svc.settings, node="own1", partition="owned", capacity="owned", gpus=8,
                                   provider="", source="hook", key="open-own1", at=T)
        reserved, _ = ns.open_session(s, w.svc.settings, node="res1", partition="reserved", capacity="reserved",
                                      gpus=8, provider="", source="hook", key="open-res1", at=T)
        assert (owned.price_known, owned.price_micros) == (1, 0)
        assert (reserved.price_known, reserved.price_micros) == (1, 8 * 400_000)
