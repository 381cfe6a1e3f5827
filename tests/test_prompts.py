"""specload.workload.prompts: exact-length, reproducible prompts that no prefix cache can serve."""

from __future__ import annotations

import msgspec
import pytest

from specload.workload.prompts import IDS, TEXT, PromptSource, make_prompt, prompt_ids, prompt_text
from specload.workload.vocab import IdPool


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
    assert msgspec.convert(msgspec.msgpack.decode(msgspec.msgpack.encode(pool)), IdPool) == pool  # the wire


def test_source_overhead_is_taken_off_the_units() -> None:
    # The server adds 3 tokens (say BOS and two template markers): 3 fewer units are sent.
    ids = PromptSource(IDS, "t", ids=R(10, 20), overhead=3)
    assert len(make_prompt(ids, 0, 1, 100)) == 97
    words = PromptSource(TEXT, "t", words=("a", "b"), overhead=12)
    assert len(str(make_prompt(words, 0, 1, 100)).split()) == 88
    for src in (ids, words):  # as the run config carries it
        assert msgspec.convert(msgspec.msgpack.decode(msgspec.msgpack.encode(src)), PromptSource) == src


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

    import specload.workload.vocab as vocab

    monkeypatch.setattr(vocab, "_FLAT_MAX", 5)
    pool = IdPool.from_ids([1, 2, 3, 50, 51, 52, 53])
    ids = pool.draw(random.Random(2), 500)
    assert set(ids) <= {1, 2, 3, 50, 51, 52, 53} and len(set(ids)) == 7


# -- the tape: how a prompt is drawn since the per-request cost work (specload.workload.prompts' doc) ---------


def test_prompt_is_fresh_lead_then_a_window_of_the_seeds_tape() -> None:
    import random

    from specload.workload.prompts import LEAD, MAX_WINDOW, TAPE_STARTS

    pool = R(1000, 30000)
    p = prompt_ids(4, 11, 1000, pool)
    rng = random.Random("specload-4-11")
    assert p[:LEAD] == pool.draw(rng, LEAD)  # the prompt's own generator: the same first ids as ever
    start = int(rng.random() * TAPE_STARTS)
    tape = pool.draw(random.Random("specload-tape-4"), TAPE_STARTS + MAX_WINDOW)
    assert p[LEAD:] == tape[start + LEAD : start + 1000]


def test_prompts_are_pinned_across_versions() -> None:
    # A rerun (or another version of specload) with the same seed must send the same prompts: a
    # change here changes every prompt of every run, and needs a changelog entry, not a new hash.
    import hashlib

    def h(x: object) -> str:
        return hashlib.sha256(repr(x).encode()).hexdigest()[:16]

    scattered = IdPool.from_ids([*range(3, 900, 7), *range(5000, 5100)])
    assert h(prompt_ids(0, 7, 1000, R(1000, 30000))) == "a627a732c8461f6c"
    assert h(prompt_ids(42, 17, 500, R(1000, 30000))) == "116c36c24fa6a979"
    assert h(prompt_ids(3, 1_000_005, 2000, scattered)) == "23720cbeb45f791e"
    assert h(prompt_ids(1, 2, 5, R(1000, 30000))) == "d6118d05022a8203"  # short: unit by unit
    assert hashlib.sha256(prompt_text(5, 3, 100).encode()).hexdigest()[:16] == "fb0c384001ec88d3"


def test_prompts_are_the_same_in_another_process_whatever_came_first() -> None:
    # Every Locust process builds its own tape: the prompt of a ticket must not depend on the
    # process, its hash seed, or which prompts (long, short, shared prefix) it made before.
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json; from specload.workload.prompts import prompt_ids, prompt_text; from specload.workload.vocab import IdPool;"
        "R = IdPool(((1000, 30000),));"
        "prompt_ids(9, 1, 40000, R); prompt_ids(9, 2, 300, R, shared_prefix=50); prompt_text(9, 4, 3000);"
        "print(json.dumps([prompt_ids(9, 3, 700, R), prompt_text(9, 5, 400)]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [prompt_ids(9, 3, 700, R(1000, 30000)), prompt_text(9, 5, 400)]


def test_many_prompts_share_no_prefix() -> None:
    # 3000 prompts sorted: any two with a common start are neighbours; none shares even 3 ids.
    pool = R(1000, 30000)
    prompts = sorted(prompt_ids(0, n, 200, pool) for n in range(3000))
    common = 0
    for a, b in zip(prompts, prompts[1:], strict=False):
        k = 0
        while k < len(a) and a[k] == b[k]:
            k += 1
        common = max(common, k)
    assert common < 3


def _repeated_ngram(ids: list[int], k: int) -> bool:
    seen = set()
    for i in range(len(ids) - k + 1):
        g = tuple(ids[i : i + k])
        if g in seen:
            return True
        seen.add(g)
    return False


@pytest.mark.parametrize("extra", [0, 1, 5000])
def test_a_long_prompt_never_repeats_a_stretch_of_itself(extra: int) -> None:
    # Up to MAX_WINDOW a window of the tape, beyond it drawn id by id: never the tape wrapped
    # around (an n-gram speculator would find the repeat and accept drafts it should not).
    from specload.workload.prompts import MAX_WINDOW

    n = MAX_WINDOW + extra
    p = prompt_ids(2, 8, n, R(1000, 30000))
    assert len(p) == n
    assert not _repeated_ngram(p, 6)


def test_prompt_ids_stay_uniform_over_the_pool_across_prompts() -> None:
    from collections import Counter

    pool = R(0, 20)
    counts = Counter(i for n in range(400) for i in prompt_ids(7, n, 100, pool))
    assert set(counts) == set(range(20))
    assert max(counts.values()) < 2300 and min(counts.values()) > 1700  # 2000 each


def test_shared_prefix_is_made_once_and_handed_out_as_a_copy() -> None:
    pool = R(1000, 30000)
    first = prompt_ids(5, 0, 100, pool, shared_prefix=40)
    first[0] = -1  # the caller's list is its own
    again = prompt_ids(5, 1, 100, pool, shared_prefix=40)
    assert again[0] != -1 and again[:40] == prompt_ids(5, 2, 100, pool, shared_prefix=40)[:40]
    words = prompt_text(5, 0, 60, shared_prefix=20).split()
    assert words[:20] == prompt_text(5, 1, 60, shared_prefix=20).split()[:20]


def test_prompts_do_not_depend_on_the_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    # The per-process memo (tapes, shared prefixes) is a cache only: emptied at every call, the
    # prompts are the same.
    import specload.workload.prompts as prompts

    want = [
        prompt_ids(s, n, 300, R(1000, 30000), shared_prefix=n % 2 * 30) for s in range(3) for n in range(3)
    ]
    want_text = [prompt_text(s, 1, 50) for s in range(3)]
    monkeypatch.setattr(prompts, "_MEMO_MAX", 1)
    pool = R(1000, 30000)  # a new pool: a new, empty memo
    assert [prompt_ids(s, n, 300, pool, shared_prefix=n % 2 * 30) for s in range(3) for n in range(3)] == want
    assert [prompt_text(s, 1, 50) for s in range(3)] == want_text


def test_prime_draws_the_tape_ahead() -> None:
    from specload.workload.prompts import prime

    src = PromptSource(IDS, "t", ids=R(1000, 30000))
    prime(src, 77)
    assert ("tape", 77) in src.ids.memo
    words = PromptSource(TEXT, "t", words=("a", "b", "c"))
    prime(words, 77)
    assert len(prompt_text(77, 1, 500, words.words).split()) == 500


def test_word_count_text() -> None:
    from specload.workload.vocab import word_count_text

    assert word_count_text([]) == ""
    assert word_count_text(["a"]) == " a"
    assert word_count_text(["a", "bc", "d"]) == " a bc d"
