"""Key placement: hashed ranges balance sequential and skewed ids; ranges dealt round the
ring (vnodes); a join or leave moves about 1/n of them and keeps the shares even."""
import numpy as np
import pytest

from mpips.kernels import hashing
from mpips.wire.placement import Placement, by_range, dealt, describe_ranges, load_spread, moved, rebalanced, ring_holders, with_server, without_server


@pytest.mark.parametrize("n_servers", [2, 3, 4, 7])
@pytest.mark.parametrize("pattern", ["sequential", "strided", "high_bits", "clustered"])
def test_balanced(n_servers, pattern):
    n = 200_000
    i = np.arange(n, dtype=np.uint64)
    keys = {
        "sequential": i,
        "strided": i * np.uint64(1024),                       # ids that share low bits
        "high_bits": i << np.uint64(40),                      # ids that differ only high up
        "clustered": np.uint64(2**64 - 1) - i,                # the top of the key space
    }[pattern]
    counts = np.bincount(Placement(n_servers).owners(keys), minlength=n_servers)
    assert counts.sum() == n
    assert np.abs(counts / n - 1 / n_servers).max() < 0.01, counts


@pytest.mark.parametrize("n_servers", [2, 3, 5])
@pytest.mark.parametrize("n_keys", [0, 1, 2, 10, 5000])
def test_split_groups_keys_by_owner_in_order(n_servers, n_keys):
    keys = np.unique(np.random.default_rng(n_keys).integers(0, 2**63, n_keys, dtype=np.uint64))
    p = Placement(n_servers)
    perm, offsets = p.by_server(keys)
    owner = p.owners(keys)
    assert sorted(perm.tolist()) == list(range(keys.shape[0]))
    assert offsets.tolist() == [0, *np.cumsum(np.bincount(owner, minlength=n_servers))]
    for s in range(n_servers):
        part = perm[offsets[s]:offsets[s + 1]]
        assert (owner[part] == s).all()
        assert (np.diff(part) > 0).all(), "stable: each server's keys stay sorted"


@pytest.mark.parametrize("n_groups", [1, 2, 3, 7])
def test_grouping_by_owner_is_a_stable_sort_whatever_the_number_of_groups(n_groups):
    """The two-group pass and the counting sort give what a stable sort gives, runs of one
    owner and a group left empty included."""
    rng = np.random.default_rng(n_groups)
    for owner in (rng.integers(0, n_groups, 1000), np.zeros(50, int),
                  np.repeat(np.arange(n_groups), 3)[::-1], np.full(7, n_groups - 1)):
        owner = owner.astype(np.int32)
        perm, offsets = hashing.group_by_owner(owner, n_groups)
        np.testing.assert_array_equal(perm, np.argsort(owner, kind="stable"))
        assert offsets.tolist() == [0, *np.cumsum(np.bincount(owner, minlength=n_groups))]


def test_one_server_needs_no_permutation():
    keys = np.arange(10, dtype=np.uint64)
    perm, offsets = Placement(1).by_server(keys)
    assert perm is None and offsets.tolist() == [0, 10]


def test_ring_puts_backups_on_the_next_servers_of_other_nodes_first():
    assert ring_holders(4, 2) == ((0, 1), (1, 2), (2, 3), (3, 0))
    assert ring_holders(3, 3) == ((0, 1, 2), (1, 2, 0), (2, 0, 1))
    # Servers 0,1 on one node and 2,3 on another: every range has a copy on each node.
    assert ring_holders(4, 2, nodes=[0, 0, 1, 1]) == ((0, 2), (1, 2), (2, 0), (3, 0))
    # Too few nodes for distinct ones: the next servers on the ring.
    assert ring_holders(3, 3, nodes=[5, 5, 5]) == ((0, 1, 2), (1, 2, 0), (2, 0, 1))
    with pytest.raises(ValueError, match="at least as many servers"):
        Placement(2, replicas=3)


def test_without_a_server_its_backups_become_primaries():
    keys = np.unique(np.random.default_rng(2).integers(0, 2**63, 4000, dtype=np.uint64))
    before = Placement(4, replicas=2)
    after = before.without({1})
    assert after.version == before.version + 1 and after.lost == ()
    moved = before.owners(keys) == 1
    assert (after.owners(keys)[moved] == 2).all(), "range 1's backup is server 2"
    assert (after.owners(keys)[~moved] == before.owners(keys)[~moved]).all()
    assert after.holders == ((0, 2), (2, 3), (2, 3), (3, 0)), "lost copies go to the next"
    twice = after.without({2})
    assert twice.holders == ((0, 3), (3, 0), (3, 0), (3, 0))
    assert twice.holders == before.without({2}).without({1}).holders == \
        before.without({1, 2}).holders, "whatever the order the deaths are learned in"
    assert twice.version == 2 and before.without({1, 2}).version == 2
    assert before.without({0, 1, 2, 3}).lost == (0, 1, 2, 3)


def test_reads_go_to_the_primary_writes_to_any_holder():
    keys = np.unique(np.random.default_rng(3).integers(0, 2**63, 2000, dtype=np.uint64))
    p = Placement(3, replicas=2)
    of_range_0 = keys[p.ranges_of(keys) == 0]
    assert p.first_misplaced(of_range_0, 0) == (-1, "")
    assert p.first_misplaced(of_range_0, 1) == (0, "held by another server")   # backup
    assert p.first_misplaced(of_range_0, 1, as_primary=False) == (-1, "")
    assert p.first_misplaced(of_range_0, 2, as_primary=False) == (0, "held by another server")
    assert p.first_misplaced(of_range_0[::-1], 0)[1] == "not in strictly increasing order"
    assert p.holds(keys, 1).sum() == (p.ranges_of(keys) <= 1).sum()
    assert (p.backup_ranges(1) == [True, False, False]).all()


@pytest.mark.parametrize("n_servers, vnodes", [(1, 1), (2, 1), (3, 1), (3, 64), (5, 77),
                                               (16, 64)])
def test_a_key_falls_in_the_range_its_hash_does(n_servers, vnodes):
    """key_range computes the range from the hash: the same as a search of the sorted
    bounds, at the bounds, just below them and at the ends of the hash too."""
    from mpips.kernels.hashing import key_range
    p = Placement(n_servers, vnodes=vnodes)
    hashes = np.concatenate([np.random.default_rng(4).integers(0, 2**64 - 1, 3000, np.uint64,
                                                               endpoint=True),
                             p.bounds, p.bounds[1:] - np.uint64(1),
                             np.array([0, 2**64 - 1], np.uint64)])
    found = [key_range(h, p.bounds) for h in hashes]
    np.testing.assert_array_equal(found, np.searchsorted(p.bounds, hashes, side="right") - 1)
    assert p.n_ranges == n_servers * vnodes


@pytest.mark.parametrize("vnodes", [1, 8, 64])
def test_vnodes_deal_ranges_round_the_ring_and_keep_backups_next(vnodes):
    p = Placement(4, replicas=2, vnodes=vnodes)
    assert p.assign == tuple(r % 4 for r in range(4 * vnodes))
    assert all(h == (r % 4, (r + 1) % 4) for r, h in enumerate(p.holders))
    keys = np.arange(200_000, dtype=np.uint64)
    counts = np.bincount(p.owners(keys), minlength=4)
    assert np.abs(counts / keys.shape[0] - 0.25).max() < 0.01, counts
    after = p.without({1})
    assert all(h[0] != 1 for h in after.holders) and after.lost == ()
    moved = p.owners(keys) == 1
    assert (after.owners(keys)[moved] == 2).all(), "server 1's backup, 2, answers its keys"


@pytest.mark.parametrize("n, vnodes", [(2, 64), (3, 64), (4, 64), (8, 64), (16, 64), (4, 8)])
def test_a_join_or_a_leave_moves_about_one_nth_of_the_ranges_and_keeps_shares_even(n, vnodes):
    before = dealt(n, vnodes)
    joined = with_server(before, n)
    share = [joined.count(s) for s in range(n + 1)]
    assert max(share) - min(share) <= 1, share
    assert moved(before, joined) <= 1.5 / (n + 1) and moved(before, joined) >= 0.5 / (n + 1)
    assert all(a == b or b == n for a, b in zip(before, joined)), "only to the new server"
    left = without_server(joined, 0)
    share = [left.count(s) for s in range(1, n + 1)]
    assert 0 not in left and max(share) - min(share) <= 1, share
    assert moved(joined, left) <= 1.5 / (n + 1)
    assert all(a == b or a == 0 for a, b in zip(joined, left)), "only server 0's ranges"
    keys = np.arange(100_000, dtype=np.uint64)
    p, q = Placement(n, vnodes=vnodes), Placement(n + 1, assign=joined)
    assert np.mean(p.owners(keys) != q.owners(keys)) == pytest.approx(moved(before, joined),
                                                                       abs=0.02)


@pytest.mark.parametrize("replicas", [1, 2])
def test_on_the_way_to_new_owners_the_new_holders_back_up_and_the_owners_answer(replicas):
    """A move's placement on the way (`toward`): reads as before, writes also to every
    server that holds a range afterwards, so that it has the range when it owns it."""
    before = Placement(4, replicas, vnodes=4, assign=dealt(3, 4) + tuple([0] * 4))
    after = Placement(4, replicas, version=2, assign=with_server(before.assign, 3))
    on_the_way = before.toward(after)
    assert on_the_way.version == 1 and on_the_way.assign == before.assign
    keys = np.arange(50_000, dtype=np.uint64)
    np.testing.assert_array_equal(on_the_way.owners(keys), before.owners(keys))
    for r in range(before.n_ranges):
        assert set(on_the_way.holders[r]) == set(before.holders[r]) | set(after.holders[r])
        assert on_the_way.holders[r][:len(before.holders[r])] == before.holders[r]
    assert on_the_way.has_backups and before.has_backups == (replicas > 1)
    assert on_the_way.held_ranges(3).sum() == after.held_ranges(3).sum() > 0
    assert not on_the_way.primary_ranges(3).any(), "the new server answers no read yet"
    fields = on_the_way.extra_fields()
    assert fields.shape == (before.n_ranges, replicas)
    assert Placement.extra_of(fields) == on_the_way.extra
    assert on_the_way.without({1}).extra == {r: tuple(x for x in s if x != 1)
                                             for r, s in on_the_way.extra.items()
                                             if set(s) - {1}}


def test_a_placement_made_again_from_its_record_as_json_is_the_same():
    """A resident checkpoint writer is told the placement at the clock as JSON."""
    import json
    before = Placement(4, 2, vnodes=4, assign=dealt(3, 4) + tuple([0] * 4))
    moving = before.toward(Placement(4, 2, version=2, assign=with_server(before.assign, 3)))
    for p in (before, moving.without({1}), Placement(1)):
        again = Placement.of_record(json.loads(json.dumps(p.record())))
        assert again.describe() == p.describe() and again.backups_since == p.backups_since
        keys = np.arange(10_000, dtype=np.uint64)
        np.testing.assert_array_equal(again.owners(keys), p.owners(keys))


def test_a_leaving_servers_ranges_go_to_a_server_that_holds_none_yet():
    assert without_server((0, 1, 2), 0, servers=range(4)) == (3, 1, 2)
    assert without_server((0, 1, 2), 0) == (1, 1, 2), "without the members: the owners only"


def test_the_last_server_cannot_leave():
    with pytest.raises(ValueError, match="server 0 is the last server"):
        without_server((0, 0, 0), 0)


def test_many_ranges_are_named_briefly():
    assert describe_ranges([3, 1]) == "[1, 3]"
    assert describe_ranges(range(100)) == "100 ranges (0, 1, 2, 3, 4, 5, ...)"


def test_a_spare_stands_in_for_a_dead_server_and_takes_copies_of_all_it_held():
    p = Placement(4, replicas=2, assign=dealt(3, 4))   # servers 0-2 hold, 3 is a spare
    assert p.spares == (3,) and not p.held_ranges(3).any()
    after = p.without({1})
    assert after.stand_in == {1: 3}
    np.testing.assert_array_equal(after.held_ranges(3), p.held_ranges(1))
    assert not after.primary_ranges(3).any(), "no copy yet: the living copies answer"
    for server in (0, 2):   # the survivors take on no more copies than they had
        assert after.held_ranges(server).sum() == p.held_ranges(server).sum()
    assert p.without({3}).holders == p.holders, "a dead spare changes nothing"
    both = p.without({1, 2})   # one spare for two deaths: server 1's goes to the spare
    assert both.stand_in == {1: 3} and both.holders == p.without({2}).without({1}).holders


def test_rebalancing_moves_ranges_off_the_busiest_server_until_no_move_helps():
    assign = dealt(2, 4)   # server 0: ranges 0, 2, 4, 6; server 1: 1, 3, 5, 7
    load = [10, 1, 10, 1, 10, 1, 10, 1]   # server 0 answers 40 reads for server 1's 4
    after = rebalanced(assign, load)
    assert load_spread(assign, load) == pytest.approx(40 / 22)
    assert load_spread(after, load) <= 23 / 22, "within one small range of even"
    assert set(after) == {0, 1}
    assert rebalanced(assign, [1] * 8) == assign, "an even load stays"


def test_rebalancing_leaves_spares_alone_and_a_server_its_last_range():
    after = rebalanced((0, 0, 1), [5, 5, 0])   # (a third server, a spare, owns none)
    assert load_spread(after, [5, 5, 0]) == 1.0 and 2 not in after
    assert rebalanced((0, 1), [9, 0]) == (0, 1), "server 0 keeps its one range"


def test_keys_grouped_by_range_in_their_order():
    p = Placement(2, vnodes=4)
    keys = np.random.default_rng(1).permutation(np.arange(1, 2000, dtype=np.uint64))
    ranges = p.ranges_of(keys)
    order, starts = by_range(ranges, p.n_ranges)
    assert starts[0] == 0 and starts[-1] == keys.shape[0]
    for r in range(p.n_ranges):
        np.testing.assert_array_equal(keys[order[starts[r]:starts[r + 1]]], keys[ranges == r])


def test_the_first_living_server_leads():
    p = Placement(4, replicas=2)
    assert p.living == (0, 1, 2, 3) and p.lead == 0 and p.others(0) == [1, 2, 3]
    after = p.without({0, 2})
    assert after.living == (1, 3) and after.lead == 1
    assert after.others(1) == [3] and after.others(3) == [1]
