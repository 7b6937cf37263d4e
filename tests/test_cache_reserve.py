"""A reserved cache pool (CachePool.reserve): room for many streams as an address range that the system backs
only where streams write, so the pool does not stall every stream copying itself to grow, and gives pages
back on shrink. The same outputs as a growing pool."""
from __future__ import annotations

import pytest
import torch

from models.cache_pool import MAP_NORESERVE, CachePool
from models.translate import simulate
from tests.conftest import random_decoder, tiny_config

pytestmark = pytest.mark.skipif(not MAP_NORESERVE, reason="reservations need Linux's MAP_NORESERVE")
SENTENCES = ["a b c d e f g", "b c d e f g h i j", "c d e", "a", "d d e f a b c g h", "e f", "g a b c d e"] * 3


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_a_reserved_pool_writes_what_a_growing_pool_writes(piece_tok):
    for policy in ("waitk", "gma", "offline"):
        grown = random_decoder(piece_tok, policy, seed=4)
        reserved = random_decoder(piece_tok, policy, seed=4)
        assert reserved.pool.reserve(64) == 64
        a = [(r.prediction, r.token_delays) for r in simulate(grown, SENTENCES, batch_size=21)]
        b = [(r.prediction, r.token_delays) for r in simulate(reserved, SENTENCES, batch_size=21)]
        assert a == b
        assert reserved.pool.capacity == 64 and grown.pool.capacity == 32   # the one grew 4 -> 32, the other did not


def test_reserve_keeps_what_is_there_grows_past_it_and_shrinks_by_giving_pages_back(word_tok):
    pool = CachePool(tiny_config(word_tok, "gma", max_positions=256, d_model=64), capacity=4)
    held = [pool.allocate() for _ in range(3)]
    pool.tensors["dec_k"][:, held[1]] = 7.0
    assert pool.reserve(40) == 40 and pool.capacity == 40
    assert bool((pool.tensors["dec_k"][:, held[1]] == 7).all()) and float(pool.tensors["dec_k"][:, 5].abs().sum()) == 0
    more = [pool.allocate() for _ in range(33)]                     # 36 in use
    pool.tensors["cross_v"][:, more[-1]] = 3.0
    before = rss()
    for s in more:
        pool.release(s)
    pool.shrink()          # the peak since the last shrink was 36: nothing to give yet
    assert pool.shrink() == 28 and pool.committed == 8              # next call: twice the 3 in use, a power of two
    assert rss() < before
    assert float(pool.tensors["cross_v"][:, more[-1]].abs().sum()) == 0      # given back: zeros again
    assert bool((pool.tensors["dec_k"][:, held[1]] == 7).all())              # a stream's slot untouched
    for _ in range(38):    # past the reservation: ordinary growth, contents kept
        pool.allocate()
    assert pool.capacity == 80 and not pool.reserved
    assert bool((pool.tensors["dec_k"][:, held[1]] == 7).all())


def test_reserve_is_a_cpu_and_growing_pool_thing(word_tok):
    cfg = tiny_config(word_tok, "waitk")
    assert CachePool(cfg, capacity=4, fixed=True).reserve(16) == 0
    assert CachePool(cfg, capacity=32).reserve(16) == 0
    if torch.cuda.is_available():
        assert CachePool(cfg, "cuda", capacity=4).reserve(16) == 0


def test_is_free_agrees_with_the_free_heap_through_random_use(word_tok):
    """CachePool.is_free (a flag per slot, kept beside the heap) against `in` on the heap, while streams start and
    end at random and the pool grows and shrinks; releasing a free slot or one outside the pool stays an error."""
    import random
    pool = CachePool(random_decoder(word_tok, "gma", seed=1).cfg, capacity=8)
    rng, held, shrunk = random.Random(2), [], 0
    for n in range(3000):
        release = (0.3, 0.8, 0.45)[n // 1000]   # (the streams come, mostly go, then come and go)
        if held and (rng.random() < release or len(held) > 200):
            pool.release(held.pop(rng.randrange(len(held))))
        else:
            held.append(pool.allocate())
        if rng.random() < 0.02:
            shrunk += pool.shrink() > 0
        assert len(pool.used) == pool.capacity
        for slot in range(pool.capacity):
            assert pool.is_free(slot) == (slot in pool.free)
    assert shrunk > 0   # (the walk did cut the pool down, not only grow it)
    for slot in held:
        pool.release(slot)
    assert all(pool.is_free(slot) for slot in range(pool.capacity))
    with pytest.raises(ValueError, match="not in use"):
        pool.release(held[0])
    with pytest.raises(ValueError, match="not in use"):
        pool.release(pool.capacity)
