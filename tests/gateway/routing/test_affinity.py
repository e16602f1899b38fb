"""prefix_affinity: stability, bounded load, membership changes, the hot spot, engine restarts."""

from __future__ import annotations

import random
from collections import Counter

import orjson

from gateway.routing.affinity import PrefixAffinity, _Ring, prefix_hashes
from gateway.routing.backend import Backend, CacheLife
from gateway.routing.policy import RouteRequest
from gateway.settings import AffinitySettings
from tests.gateway.routing.conftest import probed_backends


def system_prompt(i: int) -> str:
    rng = random.Random(i)
    return f"session {i}: " + " ".join(rng.choice("abcdefgh") * rng.randint(1, 8)
                                       for _ in range(500))


def chat(messages: list[dict[str, str]]) -> RouteRequest:
    return RouteRequest("m", None, orjson.dumps(messages))


class Session:
    def __init__(self, i: int) -> None:
        self.messages = [{"role": "system", "content": system_prompt(i)}]
        self.turn = 0

    def next_request(self) -> RouteRequest:
        self.turn += 1
        self.messages.append({"role": "user", "content": f"question {self.turn} " * 5})
        return chat(self.messages)

    def answered(self) -> None:
        self.messages.append({"role": "assistant", "content": f"answer {self.turn} " * 20})


def test_prefix_hashes_extend_with_the_prompt() -> None:
    short, longer = b"x" * 1000, b"x" * 1000 + b"y" * 600
    a, b = prefix_hashes(short, 256, 64), prefix_hashes(longer, 256, 64)
    assert len(a) == 3 and len(b) == 6  # partial tails are left out
    assert b[:3] == a
    assert prefix_hashes(b"x" * 100, 256, 64) == []
    assert len(prefix_hashes(b"x" * 10_000, 256, 4)) == 4


def test_each_session_stays_on_one_replica_and_sessions_spread() -> None:
    pool = probed_backends(3)
    policy = PrefixAffinity()
    sessions = [Session(i) for i in range(60)]
    homes: dict[int, set[str]] = {i: set() for i in range(60)}
    for _ in range(5):  # turns, interleaved across sessions; idle replicas (nothing in flight)
        for i, s in enumerate(sessions):
            b = policy.pick(pool, s.next_request())
            assert b is not None
            homes[i].add(b.url)
            s.answered()
    assert all(len(h) == 1 for h in homes.values()), homes
    per_replica = Counter(next(iter(h)) for h in homes.values())
    assert len(per_replica) == 3 and min(per_replica.values()) >= 10, per_replica
    assert policy.stats.hits == 60 * 4  # every turn after the first
    assert policy.stats.misses == 60


def test_explicit_key_wins_over_the_prompt() -> None:
    pool = probed_backends(4)
    policy = PrefixAffinity()
    first = policy.pick(pool, RouteRequest("m", "user-42", b"a" * 2000))
    for i in range(20):
        prompt = bytes([65 + i]) * 3000  # unrelated prompts, same key
        assert policy.pick(pool, RouteRequest("m", "user-42", prompt)) is first


def test_short_prompts_without_a_key_go_least_outstanding() -> None:
    pool = probed_backends(2)
    pool[0].outstanding = 3
    policy = PrefixAffinity()
    assert {policy.pick(pool, RouteRequest("m", None, b"hi")) for _ in range(4)} == {pool[1]}
    assert policy.entries == 0


def test_bounded_load_falls_back_to_least_outstanding() -> None:
    pool = probed_backends(2)
    policy = PrefixAffinity(AffinitySettings(balance=0.25, miss_cost_bytes=0))
    s = Session(1)
    home = policy.pick(pool, s.next_request())
    assert home is not None
    other = pool[1] if home is pool[0] else pool[0]
    s.answered()
    req = s.next_request()
    # In flight 2 on the home, 1 elsewhere: with this request 4 in total, the bound is
    # ceil(1.25 x 4 / 2) = 3, so the home may take it.
    home.outstanding, other.outstanding = 2, 1
    assert policy.pick(pool, req) is home
    # 3 on the home, 0 elsewhere: the home would hold 4 of 4, over the bound: least-outstanding.
    home.outstanding, other.outstanding = 3, 0
    assert policy.pick(pool, req) is other
    assert policy.stats.fallbacks["overloaded"] == 1
    # The fallback re-homes the prefix (the other replica now holds it in cache): it stays there.
    home.outstanding = 0
    assert policy.pick(pool, req) is other
    assert policy.stats.keys_moved > 0


def test_slack_keeps_hits_home_a_little_past_the_bound() -> None:
    pool = probed_backends(2)
    policy = PrefixAffinity(AffinitySettings(balance=0.25, slack=1, miss_cost_bytes=0))
    s = Session(2)
    home = policy.pick(pool, s.next_request())
    assert home is not None
    other = pool[1] if home is pool[0] else pool[0]
    s.answered()
    req = s.next_request()
    home.outstanding, other.outstanding = 3, 0  # bound 3, slack 1: 4 of 4 may stay home
    assert policy.pick(pool, req) is home
    home.outstanding = 5  # 6 of 6 > ceil(1.25 x 6 / 2) + 1 = 5: over even with the slack
    assert policy.pick(pool, req) is other
    assert policy.stats.fallbacks["overloaded"] == 1


def test_a_miss_never_goes_above_the_mean() -> None:
    pool = probed_backends(2)
    policy = PrefixAffinity()
    # New prefixes: wherever their ring home is, it takes them only if that keeps it at or
    # under the mean load; with one replica 2 requests ahead, all misses go to the other one.
    pool[0].outstanding = 2
    for i in range(30):
        assert policy.pick(pool, chat([{"role": "user", "content": system_prompt(i)}])) is pool[1]
    pool[0].outstanding = 0
    picks = Counter(policy.pick(pool, chat([{"role": "user", "content": system_prompt(i)}]))
                    for i in range(100, 300))
    assert min(picks.values()) > 60  # idle: the ring spreads new prefixes over both


def test_hot_spot_one_shared_prefix_spreads_over_replicas() -> None:
    pool = probed_backends(4)
    policy = PrefixAffinity()
    shared = system_prompt(0)
    held: list[Backend] = []
    # 40 users with one shared system prompt, all in flight at once (nothing released).
    for u in range(40):
        req = chat([{"role": "system", "content": shared},
                    {"role": "user", "content": f"user {u} " * 40}])
        b = policy.pick(pool, req)
        assert b is not None and req.prefix is not None
        b.outstanding += 1
        held.append(b)
        total = sum(x.outstanding for x in pool)
        # Never over the bound: ceil(1.25 x total / 4), plus at most one request per 1,024
        # cached bytes (the shared prompt's, below the whole prompt's) for the replica that took it.
        assert b.outstanding <= -(-5 * total // 16) + len(req.prefix) // 1024, \
            [x.outstanding for x in pool]
    loads = sorted(x.outstanding for x in pool)
    assert loads[0] >= 6 and loads[-1] <= 15, loads


def test_hot_spot_sessions_still_follow_their_own_turns() -> None:
    pool = probed_backends(2)
    policy = PrefixAffinity()
    shared = system_prompt(0)
    convs = [[{"role": "system", "content": shared},
              {"role": "user", "content": f"user {u} asks " * 60}] for u in range(10)]
    first: list[Backend] = []
    for c in convs:  # turn 1 of all, in flight together: spread by the bound
        b = policy.pick(pool, chat(c))
        assert b is not None
        b.outstanding += 1
        first.append(b)
    assert {b.url for b in first} == {b.url for b in pool}
    for b in first:
        b.outstanding -= 1
    for c, b in zip(convs, first, strict=True):  # turn 2 follows turn 1's deeper prefix
        c.append({"role": "assistant", "content": "ok " * 50})
        c.append({"role": "user", "content": "and then?"})
        assert policy.pick(pool, chat(c)) is b


def test_ring_moves_about_one_nth_of_keys_on_membership_change() -> None:
    urls = [f"http://10.0.0.{i}:8000" for i in range(5)]
    keys = [random.Random(k).getrandbits(32) for k in range(20_000)]
    four, five = _Ring(urls[:4]), _Ring(urls)
    before = [four.owner(k) for k in keys]
    after = [five.owner(k) for k in keys]
    moved = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert 0.14 < len(moved) / len(keys) < 0.26  # ~1/5
    assert all(b == urls[4] for _, b in moved)  # only to the new replica
    # A replica leaving: only its own keys move (1/N of them, here about 1/4).
    three = _Ring(urls[1:4])
    left = [(a, three.owner(k)) for a, k in zip(before, keys, strict=True)
            if a != three.owner(k)]
    assert all(a == urls[0] for a, _ in left)
    assert 0.17 < len(left) / len(keys) < 0.33


def test_an_unavailable_replica_moves_only_its_sessions() -> None:
    pool = probed_backends(3)
    policy = PrefixAffinity()
    sessions = [Session(i) for i in range(60)]
    home = {}
    for i, s in enumerate(sessions):
        home[i] = policy.pick(pool, s.next_request())
        s.answered()
    gone = pool[0]
    rest = tuple(b for b in pool if b is not gone)  # what the router hands over without it
    moved = 0
    for i, s in enumerate(sessions):
        b = policy.pick(rest, s.next_request())
        if home[i] is gone:
            moved += 1
            assert b is not gone
        else:
            assert b is home[i]  # everyone else stays put
    assert policy.stats.fallbacks["unavailable"] == moved > 0


def test_a_restarted_engine_is_a_miss_not_a_hit() -> None:
    pool = probed_backends(2)
    policy = PrefixAffinity()
    s = Session(3)
    home = policy.pick(pool, s.next_request())
    assert home is not None
    s.answered()
    # What the router does when the engine's probe fails: the old cache is gone.
    home.cache_life = CacheLife(home)
    hits = policy.stats.hits
    policy.pick(pool, s.next_request())
    assert policy.stats.hits == hits and policy.stats.misses == 2
    assert policy.stats.keys_moved > 0  # the learned entries named the old cache


def test_state_is_capped() -> None:
    pool = probed_backends(2)
    policy = PrefixAffinity(AffinitySettings(max_entries=500))
    for i in range(5000):
        policy.pick(pool, RouteRequest("m", None, b"%06d" % i + b"z" * 3000))
    assert policy.entries == 500
    # The newest prefixes survive the LRU: the last one still hits.
    policy.pick(pool, RouteRequest("m", None, b"%06d" % 4999 + b"z" * 3000))
    assert policy.stats.hits == 1


def test_a_hit_stays_home_past_the_bound_by_the_cost_of_the_miss() -> None:
    def second_turn_stays_home(load: int) -> bool:
        pool = probed_backends(2)
        policy = PrefixAffinity(AffinitySettings(balance=0.25, miss_cost_bytes=1024))
        s = Session(4)
        first = s.next_request()
        home = policy.pick(pool, first)
        assert home is not None
        # A ~2.9 KB first turn, 5 whole chunks (2,560 bytes) cached: leaving costs about 2
        # queued requests.
        assert len(policy.keys(first)) * 512 // 1024 == 2
        s.answered()
        home.outstanding = load  # the other replica is idle
        stays = policy.pick(pool, s.next_request()) is home
        assert policy.stats.fallbacks["overloaded"] == (0 if stays else 1)
        return stays

    # 3: over ceil(1.25 x 4 / 2) = 3, within the miss's cost: home.
    assert second_turn_stays_home(3)
    # 6: the home would hold 7 of 7, at ceil(1.25 x 7 / 2) + 2 = 7: still home.
    assert second_turn_stays_home(6)
    # 7: 8 of 8 is over ceil(1.25 x 8 / 2) + 2 = 7: the queue now costs more than the miss.
    assert not second_turn_stays_home(7)


def test_the_cost_of_a_miss_does_not_matter_at_high_load() -> None:
    # The cost term is absolute (requests), the bound relative: 100 in flight, 70 on the home,
    # is far over ceil(1.25 x 101 / 2) + 3 = 67: the hit leaves.
    pool = probed_backends(2)
    policy = PrefixAffinity()
    s = Session(5)
    home = policy.pick(pool, s.next_request())
    assert home is not None
    s.answered()
    home.outstanding = 66
    (pool[1] if home is pool[0] else pool[0]).outstanding = 34
    assert policy.pick(pool, s.next_request()) is not home


def test_new_prefixes_balance_what_each_cache_took_in() -> None:
    # 48 sessions one after another (idle pool: every replica at the mean). Their first chunks'
    # ring homes split them 13 / 35 (seed 18): the larger share would overflow one engine's cache
    # while the other sat half empty. Placement by footprint keeps the split within one session.
    pool = probed_backends(2)
    policy = PrefixAffinity()
    ring = _Ring([b.url for b in pool])
    sessions = [Session(18_000 + i) for i in range(48)]
    reqs = [s.next_request() for s in sessions]
    by_ring = Counter(ring.owner(policy.keys(r)[0]) for r in reqs)
    assert sorted(by_ring.values()) == [13, 35]
    placed = Counter(policy.pick(pool, r) for r in reqs)
    assert sorted(placed.values()) in ([24, 24], [23, 25]), placed
    fps = [b.cache_life.footprint for b in pool]
    assert abs(fps[0] - fps[1]) <= max(len(r.prefix or b"") for r in reqs)
    # Most still went to their ring home (gateways agree on it without shared state).
    assert policy.stats.fallbacks["miss_rebalanced"] <= 14


def test_footprint_counts_only_what_the_cache_did_not_hold() -> None:
    pool = probed_backends(2)
    policy = PrefixAffinity()
    s = Session(6)
    r1 = s.next_request()
    home = policy.pick(pool, r1)
    assert home is not None and r1.prefix is not None
    assert home.cache_life.footprint == len(r1.prefix)
    s.answered()
    r2 = s.next_request()
    assert r2.prefix is not None
    assert policy.pick(pool, r2) is home
    matched = len(policy.keys(r1)) * 512  # turn 1's whole chunks, found in turn 2's prompt
    assert home.cache_life.footprint == len(r1.prefix) + len(r2.prefix) - matched


def test_a_restarted_engine_takes_new_prefixes_first_but_not_forever() -> None:
    pool = probed_backends(2)
    policy = PrefixAffinity()
    a, b = pool
    a.cache_life.footprint = b.cache_life.footprint = 50 << 20  # a long uptime
    b.cache_life = CacheLife(b)  # b restarted: empty cache, footprint 0
    # b is behind by far more than the window: it is caught up to 1 MiB behind, then takes the
    # new prefixes (both idle, so both at the mean) until it has taken in about that much.
    taken = Counter(policy.pick(pool, RouteRequest("m", None, b"%06d" % i + b"z" * 4000))
                    for i in range(400))
    assert b.cache_life.footprint >= (50 << 20) - (1 << 20)
    assert 250 <= taken[b] < 400 and taken[a] > 0, taken
