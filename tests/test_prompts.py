"""specload.prompts: exact-length, reproducible prompts that no prefix cache can serve."""

from __future__ import annotations

import pytest

from specload.prompts import IDS, TEXT, PromptSource, make_prompt, prompt_ids, prompt_text
from specload.vocab import IdPool


def R(lo: int, hi: int) -> IdPool:
    return IdPool(((lo, hi),))


@pytest.mark.parametrize("length", [1, 2, 32, 1000, 4097])
def test_prompt_ids_has_exact_length(length: int) -> None:
    assert len(prompt_ids(0, 7, length, R(1000, 30000))) == length


@pytest.mark.parametrize("shared", [1, 16, 999])
def test_prompt_ids_exact_length_with_shared_prefix(shared: int) -> None:
    assert len(prompt_ids(0, 7, 1000, R(1000, 30000), shared_prefix=shared)) == 1000


def test_prompt_ids_within_half_open_range() -> None:
    # A narrow range with many draws: both ends of [5, 8) must show up, 8 never.
    ids = prompt_ids(3, 1, 3000, R(5, 8))
    assert set(ids) == {5, 6, 7}
    wide = prompt_ids(3, 2, 5000, R(1000, 30000), shared_prefix=100)
    assert min(wide) >= 1000
    assert max(wide) < 30000
    assert all(isinstance(x, int) for x in wide)


def test_prompt_ids_differ_per_request_number() -> None:
    prompts = [prompt_ids(0, n, 64, R(1000, 30000)) for n in range(50)]
    assert len({tuple(p) for p in prompts}) == 50
    # Distinct from the very first token on: no prefix cache can share even one block.
    assert len({p[0] for p in prompts}) > 40


def test_prompt_ids_reproducible_for_same_seed_and_number() -> None:
    assert prompt_ids(42, 17, 500, R(1000, 30000)) == prompt_ids(42, 17, 500, R(1000, 30000))
    assert prompt_ids(42, 17, 500, R(1000, 30000), 100) == prompt_ids(42, 17, 500, R(1000, 30000), 100)


def test_prompt_ids_differ_across_seeds() -> None:
    a = prompt_ids(0, 5, 200, R(1000, 30000))
    b = prompt_ids(1, 5, 200, R(1000, 30000))
    assert a != b
    # Not merely a permutation or a shifted copy: most positions differ.
    assert sum(x != y for x, y in zip(a, b, strict=True)) > 190


def test_prompt_ids_seed_and_number_do_not_alias() -> None:
    # "seed 1, n 23" and "seed 12, n 3" must not be the same stream.
    assert prompt_ids(1, 23, 100, R(1000, 30000)) != prompt_ids(12, 3, 100, R(1000, 30000))


def test_shared_prefix_identical_rest_distinct() -> None:
    k = 48
    prompts = [prompt_ids(9, n, 128, R(1000, 30000), shared_prefix=k) for n in range(20)]
    prefixes = {tuple(p[:k]) for p in prompts}
    assert len(prefixes) == 1
    rests = [tuple(p[k:]) for p in prompts]
    assert len(set(rests)) == 20
    # The first token after the prefix already differs for (nearly) every prompt.
    assert len({r[0] for r in rests}) > 15


def test_shared_prefix_depends_on_seed() -> None:
    a = prompt_ids(1, 0, 64, R(1000, 30000), shared_prefix=32)
    b = prompt_ids(2, 0, 64, R(1000, 30000), shared_prefix=32)
    assert a[:32] != b[:32]


def test_no_shared_prefix_means_no_common_start() -> None:
    a = prompt_ids(0, 0, 64, R(1000, 30000))
    b = prompt_ids(0, 1, 64, R(1000, 30000))
    common = 0
    for x, y in zip(a, b, strict=True):
        if x != y:
            break
        common += 1
    assert common < 3


@pytest.mark.parametrize("length", [1, 2, 10, 1000])
def test_prompt_text_word_count(length: int) -> None:
    text = prompt_text(0, 12, length)
    assert len(text.split()) == length
    # Every word after one space: each is then the same single token wherever it stands.
    assert text.startswith(" ") and text == " " + " ".join(text.split())


@pytest.mark.parametrize("shared", [1, 5, 63])
def test_prompt_text_word_count_with_shared_prefix(shared: int) -> None:
    assert len(prompt_text(0, 12, 64, shared_prefix=shared).split()) == 64


def test_prompt_text_differs_from_its_first_words() -> None:
    texts = [prompt_text(0, n, 40).split() for n in range(30)]
    assert len({tuple(t) for t in texts}) == 30
    assert len({tuple(t[:2]) for t in texts}) > 25


def test_prompt_text_reproducible_and_seeded() -> None:
    assert prompt_text(5, 3, 100) == prompt_text(5, 3, 100)
    assert prompt_text(5, 3, 100) != prompt_text(6, 3, 100)


def test_prompt_text_shared_prefix_identical_rest_distinct() -> None:
    k = 10
    texts = [prompt_text(2, n, 50, shared_prefix=k).split() for n in range(10)]
    assert len({tuple(t[:k]) for t in texts}) == 1
    assert len({tuple(t[k:]) for t in texts}) == 10


def test_pool_of_scattered_ids_draws_only_those_ids() -> None:
    pool = IdPool.from_ids([3, 4, 5, 9, 100, 101])
    assert pool.ranges == ((3, 6), (9, 10), (100, 102)) and pool.size == 6
    ids = prompt_ids(1, 2, 3000, pool)
    assert set(ids) == {3, 4, 5, 9, 100, 101}
    assert IdPool.from_wire(pool.to_wire()) == pool


def test_source_overhead_is_taken_off_the_units() -> None:
    # The server adds 3 tokens (say BOS and two template markers): 3 fewer units are sent.
    ids = PromptSource(IDS, "t", ids=R(10, 20), overhead=3)
    assert len(make_prompt(ids, 0, 1, 100)) == 97
    words = PromptSource(TEXT, "t", words=("a", "b"), overhead=12)
    assert len(str(make_prompt(words, 0, 1, 100)).split()) == 88
    assert PromptSource.from_wire(ids.to_wire()) == ids and PromptSource.from_wire(words.to_wire()) == words


def test_pool_draws_in_bulk_uniformly_and_only_from_the_pool() -> None:
    import random
    from collections import Counter

    pool = IdPool.from_ids([*range(10, 20), *range(100, 110)])
    counts = Counter(pool.draw(random.Random(1), 40_000))
    assert set(counts) == set(range(10, 20)) | set(range(100, 110))  # every id, nothing else
    assert max(counts.values()) < 2300 and min(counts.values()) > 1700  # 2000 each, +-~4.5 sd
    assert pool.draw(random.Random(1), 5) == pool.draw(random.Random(1), 5)  # reproducible
    assert pool.draw(random.Random(1), 0) == []


def test_a_pool_too_big_to_list_still_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    import specload.vocab as vocab

    monkeypatch.setattr(vocab, "_FLAT_MAX", 5)
    pool = IdPool.from_ids([1, 2, 3, 50, 51, 52, 53])
    ids = pool.draw(random.Random(2), 500)
    assert set(ids) <= {1, 2, 3, 50, 51, 52, 53} and len(set(ids)) == 7
