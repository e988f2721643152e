"""``CachedTokens``: which tokens a position-addressed cache holds, and how much of a prompt reuses."""

from __future__ import annotations

from omnidraft_deploy.speculative.kv_reuse import CachedTokens, keep, reusable


def test_records_what_each_call_wrote() -> None:
    c = CachedTokens()
    c.fed([1, 2, 3, 4], 0)  # a prefill
    c.fed([5, 6, 7], 4)  # a verify call
    c.fed([9], 5)  # the next step starts at 5: 6 was rejected, 7 lies past the new write
    assert c.ids == [1, 2, 3, 4, 5, 9]


def test_a_call_past_the_record_is_not_vouched_for() -> None:
    c = CachedTokens()
    c.fed([1, 2], 0)
    c.fed([7, 8], 5)  # positions 2..4 unknown, and what 5.. was computed from
    assert c.ids == [1, 2]


def test_reuse_is_the_shared_prefix_short_of_the_last_token() -> None:
    c = CachedTokens()
    c.fed([1, 2, 3, 4, 5], 0)
    assert c.reusable([1, 2, 3, 9, 9]) == 3
    assert c.reusable([1, 2, 3, 4, 5]) == 4  # the last token is fed again for its logits
    assert c.reusable([1, 2]) == 1
    assert c.reusable([7, 2, 3]) == 0
    assert c.reusable([1]) == 0
    c.keep(2)
    assert c.reusable([1, 2, 3, 4, 5]) == 2


def test_models_without_a_record_reuse_nothing() -> None:
    class Plain:
        pass

    keep(Plain(), 3)  # no-op
    assert reusable(Plain(), [1, 2, 3]) == 0
