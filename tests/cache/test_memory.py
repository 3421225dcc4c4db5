"""``gateway.cache.memory``: the LRU bounded in bytes, expiry on an injected clock, purges
and the marks that keep a fill begun before a purge out of the cache."""
from __future__ import annotations

from gateway.cache.entry import MAX_VIEWS, Entry, encode_rows
from gateway.cache.memory import MemoryCache


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def entry(digest, query="q", db="h:1/d", tables=("public.t",), wildcard=False, rows=10, ttl=60.0, now=1000.0):
    data = [(i, "x" * 50) for i in range(rows)]
    return Entry(digest, query, 1, db, frozenset(tables), wildcard, ("id", "v"), data, len(data), now, now + ttl,
                 now + ttl, encode_rows(("id", "v"), data, len(data)))


def test_bytes_bound_evicts_least_recently_used():
    one = entry("a").size
    cache = MemoryCache(one * 16, Clock())    # an entry may take up to a sixteenth
    cache.max_bytes = one * 3                 # then hold three
    for d in "abc":
        assert cache.put(entry(d), cache.mark('q', 'h:1/d'))
    assert cache.get("a") is not None          # a is now the most recently used
    assert cache.put(entry("d"), cache.mark("q", "h:1/d"))
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("d") is not None
    assert cache.evictions == 1 and cache.bytes == one * 3 and len(cache) == 3


def test_an_entry_larger_than_a_sixteenth_is_not_kept():
    cache = MemoryCache(16 * 1000)
    assert not cache.put(entry("big", rows=200), cache.mark("q", "h:1/d"))
    assert cache.get("big") is None and cache.bytes == 0


def test_expiry_on_the_injected_clock():
    clock = Clock()
    cache = MemoryCache(10_000_000, clock)
    cache.put(entry("a", ttl=5), cache.mark("q", "h:1/d"))
    clock.now += 4.9
    assert cache.get("a") is not None
    clock.now += 0.2
    assert cache.get("a") is None and cache.bytes == 0


def test_a_fill_begun_before_a_purge_is_not_stored():
    cache = MemoryCache(10_000_000, Clock())
    mark = cache.mark("q", "h:1/d")            # a fill begins (reads the database)
    cache.apply({"op": "tables", "db": "h:1/d", "tables": ["public.t"]})   # a write's purge meanwhile
    assert not cache.put(entry("a"), mark)
    assert cache.get("a") is None
    for purge in ({"op": "query", "name": "q"}, {"op": "db", "db": "h:1/d"}, {"op": "all"}, {"op": "key", "key": "z"}):
        mark = cache.mark("q", "h:1/d")
        cache.apply(purge)
        assert not cache.put(entry("a"), mark), purge
    # a purge that cannot name the entry (another query, another database) does not keep it out
    mark = cache.mark("q", "h:1/d")
    cache.apply({"op": "query", "name": "other"})
    cache.apply({"op": "tables", "db": "h:1/other", "tables": ["public.t"]})
    assert cache.put(entry("a"), mark) and cache.get("a") is not None


def test_purges_drop_exactly_what_they_name():
    cache = MemoryCache(10_000_000, Clock())
    cache.put(entry("t", tables=("public.t",)), cache.mark("q", "h:1/d"))
    cache.put(entry("u", tables=("public.u",)), cache.mark("q", "h:1/d"))
    cache.put(entry("view", tables=("public.v",), wildcard=True), cache.mark("q", "h:1/d"))
    cache.put(entry("other-db", db="h:1/e", tables=("public.t",)), cache.mark("q", "h:1/d"))
    cache.put(entry("named", query="r", tables=("public.z",)), cache.mark("q", "h:1/d"))
    assert cache.apply({"op": "tables", "db": "h:1/d", "tables": ["public.t"]}) == 2   # t, and the view reader
    assert {e.digest for e in cache.entries()} == {"u", "other-db", "named"}
    assert cache.apply({"op": "query", "name": "r"}) == 1
    assert cache.apply({"op": "db", "db": "h:1/e"}) == 1
    assert cache.apply({"op": "all"}) == 1 and len(cache) == 0 and cache.bytes == 0


def test_views_are_charged_while_their_entry_is_held():
    """An entry's ready answers (``Entry.keep``) count in the memory's bytes, are taken back with
    the entry (purge, eviction, replacement) and are never counted for an entry not held."""
    cache = MemoryCache(10_000_000, Clock())
    held, loose = entry("a"), entry("b")
    base = held.size
    assert cache.put(held, cache.mark("q", "h:1/d")) and cache.bytes == base
    first = object()
    assert held.keep(("json", None), first, 1000) is first and cache.bytes == base + 1000 == held.size
    # a second thread that rendered the same view meanwhile gets the first one back, charged once
    assert held.keep(("json", None), object(), 1000) is first and cache.bytes == base + 1000
    assert loose.keep(("json", None), object(), 500) is not None and cache.bytes == base + 1000   # not held
    for i in range(1, MAX_VIEWS + 3):   # past MAX_VIEWS a view is returned, not kept, not charged
        view = object()
        assert held.keep(("csv", i), view, 10) is view
    assert len(held.views) == MAX_VIEWS and cache.bytes == held.size == base + 1000 + 10 * (MAX_VIEWS - 1)
    replacement = entry("a")
    assert cache.put(replacement, cache.mark("q", "h:1/d")) and cache.bytes == replacement.size == base
    assert held.keep(("xml", None), object(), 700) is not None and cache.bytes == base   # the replaced one
    replacement.keep(("json", None), object(), 300)
    assert cache.apply({"op": "all"}) == 1 and cache.bytes == 0


def test_a_view_that_overflows_the_bound_evicts_the_least_recently_used():
    one = entry("a").size
    cache = MemoryCache(one * 16, Clock())
    cache.max_bytes = one * 3
    entries = {d: entry(d) for d in "abc"}
    for e in entries.values():
        assert cache.put(e, cache.mark("q", "h:1/d"))
    entries["c"].keep(("json", None), object(), one // 2)
    assert cache.get("a") is None and cache.evictions == 1
    assert cache.bytes == sum(e.size for e in cache.entries()) == one * 2 + one // 2   # b, and c with its view
