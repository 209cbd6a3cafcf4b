"""The demand index gives every sensor the demand the full fold gives, change by change, at a
cost of queries + sensors per change (a full fold for the 1,000th query with 207 sensors is
207,000 needs: ~200 ms a change, 114 s for the 1,000)."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import proxies.demand as demand
import proxies.demand_index as demand_index
from fjords.demand import Demand
from fjords.engine import Engine
from fjords.runtime.fjord import Fjord
from proxies.demand import QueryIds, SensorDemand, SensorView, analyse, sensor_demand
from proxies.demand_index import DemandIndex
from proxies.manager import ProxyManager
from tests.proxies.helpers import TRAFFIC, VEHICLES, make_fjord, traffic_hello

SQLS = [
    "SELECT station, speed FROM traffic WHERE speed >= {a} AND speed < {b}",
    "SELECT station, speed FROM traffic WHERE speed > {b} AND speed < {a}",  # may be empty
    "SELECT time, speed FROM traffic WHERE station = 's{i}' AND speed < {b}",
    "SELECT * FROM traffic WHERE segment IN ('S{i}', 'S{j}') SAMPLE PERIOD {p} SECONDS",
    "SELECT station FROM traffic WHERE segment = 'S{j}' LIFETIME {p} DAYS",
    "SELECT segment, AVG(speed) FROM traffic [RANGE {p} MINUTES] WHERE segment = 'S{i}' "
    "GROUP BY segment",
    "SELECT station, MAX(speed) FROM traffic [RANGE 1 HOUR SLIDE {p} MINUTES] "
    "WHERE station = 's{j}' GROUP BY station",
    "SELECT station, speed FROM traffic WHERE segment = 'S{i}' AND speed < {a} "
    "UNION ALL SELECT station, speed FROM traffic WHERE speed > {b}",
    "SELECT station, speed FROM traffic WHERE speed * 2 > {a}",  # a residual: every value
    "SELECT pair, COUNT(*) AS n FROM vehicles [RANGE {p} MINUTES] GROUP BY pair",
    "SELECT pair, speed FROM vehicles WHERE pair = 'p{i}' AND speed > {a}",
    "SELECT station FROM traffic WHERE segment >= 'S{j}' AND speed > {a}",  # no anchor
    "SELECT pair, COUNT(*) FROM vehicles [RANGE {p} MINUTES] WHERE pair IN ('p{i}', 'p{j}') "
    "GROUP BY pair",
    "SELECT speed FROM traffic WHERE station IN ('s{i}', 's{j}') AND segment = 'S{i}'",
]


def scalar(i: int, segment: int) -> tuple[str, str, SensorView]:
    static = {"station": f"s{i}", "segment": f"S{segment}"}
    return f"s{i}", "traffic", SensorView(static, "speed")


def pair(i: int) -> tuple[str, str, SensorView]:
    return f"p{i}", "vehicles", SensorView({"pair": f"p{i}"}, "speed", kind="pair")


def reference(
    fjord: Fjord,
    stream: str,
    view: SensorView,
    default_period_s: float | None,
    consumers: list[tuple[str, tuple[Demand, ...]]] | None = None,
):
    """The full fold, every query folded into the sensor's demand: what the index must equal.
    `consumers`: every query's and standing demand's, in the order they came (by default the
    queries', in registration order)."""
    if consumers is None:
        consumers = [(q.id, getattr(q, "demands", (q.demand,))) for q in fjord.queries.values()]
    needs = [analyse(cid, d, view) for cid, ds in consumers for d in ds if d.stream == stream]
    return sensor_demand(needs, view, default_period_s=default_period_s)


class Arrivals:
    """The order in which the index saw consumers come, sync by sync: the new queries (in
    registration order), then the new or changed standing demands; the fields of a demand are
    ordered by who asked first."""

    def __init__(self) -> None:
        self.seq: dict[str, tuple[int, object]] = {}
        self.n = 0

    def sync(self, fjord: Fjord, standing: dict[str, tuple[Demand, ...]]) -> None:
        for cid in [c for c in self.seq if c not in fjord.queries and c not in standing]:
            del self.seq[cid]
        for qid, rq in fjord.queries.items():
            if qid not in self.seq or self.seq[qid][1] is not rq:
                self.seq[qid] = (self.n, rq)
                self.n += 1
        for name, demands in standing.items():
            if name not in self.seq or self.seq[name][1] != demands:
                self.seq[name] = (self.n, demands)
                self.n += 1

    def consumers(self, fjord: Fjord, standing: dict[str, tuple[Demand, ...]]) -> list:
        """Every query and standing demand, in the order they came, for `reference`."""
        both = [(q.id, q.demands) for q in fjord.queries.values()] + list(standing.items())
        return sorted(both, key=lambda c: self.seq[c[0]][0])


op = st.one_of(
    st.tuples(
        st.just("add"),
        st.integers(0, len(SQLS) - 1),
        st.integers(0, 5),
        st.integers(0, 5),
        st.integers(0, 80),
        st.integers(0, 80),
        st.sampled_from([1, 5, 15, 30]),
    ),
    st.tuples(st.just("remove"), st.integers(0, 30)),
    st.tuples(st.just("again"), st.integers(0, 30), st.integers(0, len(SQLS) - 1)),
    st.tuples(st.just("sync")),
    st.tuples(st.just("sensor"), st.integers(0, 8), st.integers(0, 5)),
    st.tuples(st.just("forget"), st.integers(0, 8)),
    # a standing demand named st0..st2: set from a query's demands, or (-1) removed
    st.tuples(st.just("standing"), st.integers(0, 2), st.integers(-1, len(SQLS) - 1)),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=30), period=st.sampled_from([None, 60.0]))
def test_the_index_gives_every_sensor_the_full_folds_demand(ops, period) -> None:
    """Several changes may come between two syncs (the manager syncs per change, and before a
    new sensor); a sensor's demand is taken again only when a sync says it is stale, as the
    manager does, so a sensor left out of the stale set shows as a wrong demand."""
    fjord = make_fjord(traffic=TRAFFIC, vehicles=VEHICLES)
    engine = Engine(fjord)
    index = DemandIndex(default_period_s=period)
    sensors: dict[str, tuple[str, SensorView]] = {}
    taken: dict[str, SensorDemand] = {}  # what the manager would have given each proxy
    for sid, stream, view in [scalar(0, 0), scalar(1, 1), pair(0)]:
        index.add_sensor(sid, stream, view)
        sensors[sid] = (stream, view)
        taken[sid] = index.demand(sid)
    standing: dict[str, tuple[Demand, ...]] = {}
    arrivals = Arrivals()
    n = 0
    for o in [*ops, ("sync",)]:
        if o[0] == "add":
            _, k, i, j, a, b, p = o
            engine.add_query(SQLS[k].format(i=i, j=j, a=a, b=b, p=p), query_id=f"q{n}")
            n += 1
        elif o[0] in ("remove", "again") and fjord.queries:
            qids = list(fjord.queries)
            qid = qids[o[1] % len(qids)]
            fjord.remove_query(qid)
            if o[0] == "again":  # the same id, another query, at the end
                engine.add_query(SQLS[o[2]].format(i=1, j=0, a=20, b=40, p=5), query_id=qid)
        elif o[0] == "sensor":
            sid, stream, view = scalar(o[1], o[2]) if o[1] < 6 else pair(o[1])
            index.add_sensor(sid, stream, view)  # again: a new sensor with its attributes
            sensors[sid] = (stream, view)
            taken[sid] = index.demand(sid)
        elif o[0] == "forget" and sensors:
            sid = sorted(sensors)[o[1] % len(sensors)]
            index.remove_sensor(sid)
            del sensors[sid], taken[sid]
        elif o[0] == "standing":
            name = f"st{o[1]}"
            if o[2] < 0:
                standing.pop(name, None)
            else:
                sql = SQLS[o[2]].format(i=o[1], j=2, a=30, b=60, p=15)
                standing[name] = engine.plan(sql).demands
        elif o[0] == "sync":
            stale = index.sync(fjord.queries, dict(standing))
            arrivals.sync(fjord, standing)
            assert stale <= set(sensors)
            for sid in stale:
                taken[sid] = index.demand(sid)
            consumers = arrivals.consumers(fjord, standing)
            for sid, (stream, view) in sensors.items():
                want = reference(fjord, stream, view, period, consumers)
                assert same(taken[sid], want), sid
                assert same(index.demand(sid), taken[sid]), sid


def same(a: SensorDemand, b: SensorDemand) -> bool:
    """Equal, but for the order of the queries: the index lists the stream-wide ones first."""
    assert len(set(a.queries)) == len(a.queries)  # each once
    return replace(a, queries=tuple(sorted(a.queries))) == replace(
        b, queries=tuple(sorted(b.queries))
    )


def test_a_change_folds_queries_plus_sensors_not_their_product(monkeypatch) -> None:
    """207 sensors in 40 segments, 1,000 queries of the gateway_load mix: the 1,000th
    registration folds about 1,000 needs (the stream-wide ones, once) and each sensor's own
    few, where a fold per sensor is 207 x 1,000."""
    folded = 0
    real_fold = demand_index.fold

    def counting(items):
        nonlocal folded
        items = list(items)
        folded += len(items)
        return real_fold(items)

    monkeypatch.setattr(demand_index, "fold", counting)
    monkeypatch.setattr(demand, "fold", counting)  # (sensor_demand's: a full fold per sensor)
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    pm = ProxyManager(fjord, [])
    for i in range(207):
        pm.registry.create(traffic_hello(i, i % 40), 0.0)
    rng = random.Random(7)
    sqls = [SQLS[k] for k in (0, 0, 0, 0, 0, 2, 2, 3, 3, 6)]
    for n in range(1000):
        i, j, a = rng.randrange(207), rng.randrange(207), rng.uniform(0, 70)
        sql = sqls[n % 10].format(i=i % 40, j=j, a=round(a, 1), b=round(a + 3, 1), p=15)
        engine.add_query(sql)
        folded = 0
        pm.queries_changed()
    assert folded < 1000 + 207 * 20, folded  # (sensors x queries: 207,000)
    assert pm.stats.demand_updates > 0
    view = pm.proxies["s3"].view
    assert same(pm.proxies["s3"].demand, reference(fjord, "traffic", view, None))


def test_removing_a_sensor_specific_query_touches_only_its_sensors() -> None:
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    index = DemandIndex()
    for i in range(10):
        index.add_sensor(*scalar(i, i % 2))
    index.sync(fjord.queries)
    engine.add_query("SELECT speed FROM traffic WHERE station = 's3'", query_id="one")
    assert index.sync(fjord.queries) == {"s3"}
    engine.add_query("SELECT speed FROM traffic WHERE segment = 'S1'", query_id="odd")
    assert index.sync(fjord.queries) == {"s1", "s3", "s5", "s7", "s9"}
    engine.add_query("SELECT speed FROM traffic WHERE speed > 5", query_id="all")
    assert len(index.sync(fjord.queries)) == 10
    fjord.remove_query("one")
    assert index.sync(fjord.queries) == {"s3"}
    assert index.demand("s3").queries == ("all", "odd")  # stream-wide first
    assert index.demand("s2").queries == ("all",)


def test_query_ids_read_and_compare_like_a_tuple() -> None:
    shared = ("a", "b")
    ids = QueryIds(shared, ("c",))
    assert ids == ("a", "b", "c") and ids == ("a", "b", "c")
    assert ids != ("a", "b") and ids != ("a", "b", "d") and ids != ["a", "b", "c"]
    assert ids == QueryIds(("a", "b"), ("c",)) == QueryIds(("a",), ("b", "c"))
    assert ids != QueryIds(shared, ("d",))
    assert len(ids) == 3 and list(ids) == ["a", "b", "c"] and ids[2] == "c" and ids[:2] == shared
    assert hash(ids) == hash(("a", "b", "c")) and repr(ids) == "('a', 'b', 'c')"
    assert "b" in ids and ids.index("c") == 2
    assert SensorDemand(ids) == SensorDemand(("a", "b", "c"))


def test_a_sensor_with_an_unhashable_attribute_is_still_matched() -> None:
    """Static values index the queries that name them; a value that cannot be a key (not
    from a hello, whose attributes are scalars) leaves the sensor checked against all."""
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    index = DemandIndex()
    index.add_sensor("s9", "traffic", SensorView({"station": "s9", "segment": ["S1"]}, "speed"))
    index.add_sensor("s8", "traffic", SensorView({"station": "s8", "segment": ["S1"]}, "speed"))
    engine.add_query("SELECT speed FROM traffic WHERE station = 's9'", query_id="nine")
    assert index.sync(fjord.queries) == {"s9"}
    assert index.demand("s9").queries == ("nine",) and index.demand("s8").idle
    fjord.remove_query("nine")
    assert index.sync(fjord.queries) == {"s9"} and index.demand("s9").idle


def test_a_sensor_saying_hello_later_gets_what_concerns_it_and_nothing_removed() -> None:
    """The index by static value (a hello looks only at the queries naming its station or
    segment, and at those whose static conditions are not equalities): a removed query must
    not linger there, a query with a range on a static column must not be missed."""
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    index = DemandIndex()
    index.add_sensor(*scalar(0, 0))
    engine.add_query("SELECT speed FROM traffic WHERE segment IN ('S1', 'S2')", query_id="gone")
    engine.add_query("SELECT speed FROM traffic WHERE segment >= 'S2'", query_id="range")
    engine.add_query("SELECT speed FROM traffic WHERE station = 's2'", query_id="two")
    index.sync(fjord.queries)
    fjord.remove_query("gone")
    index.sync(fjord.queries)
    index.add_sensor(*scalar(1, 1))
    index.add_sensor(*scalar(2, 2))
    assert index.demand("s1").idle
    assert sorted(index.demand("s2").queries) == ["range", "two"]
    assert index.demand("s0").idle
