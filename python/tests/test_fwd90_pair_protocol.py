"""A model of the Hopper forward's pair kernels' barrier protocol (block_q = 64).

src/cuda/attention/fwd_sm90_pair.cuh (sk90_pair_walk), the PAIR paths of
sk90_producer (fwd_sm90_producer.cuh) and sk90_consumer
(fwd_sm90_consumer.cuh): a TMA warp streams, per tile, Q, then K_0 and
[K_{j+1}, V_j] over the sorted union of two query rows' blocks; two
consumer warpgroups of four warps each take one turn per union block plus
one. This file runs that protocol without a GPU: the TMA warp, the eight
consumer warps and the TMA engine are generators under random
interleavings (with random speeds, so that one warp can fall behind its
warpgroup), mbarriers complete phases when their arrivals and, for loads,
a later transaction event are in, every wait is by parity as on the
hardware, and the turn barriers are named barriers counted in warps.

A run fails on a deadlock; on a wait whose barrier is not at the wanted
phase or the one after (on the GPU the parity then reads wrong: two phases
ahead, the waiter waits for good, which is the 64 x 128 hang this file was
written for); on a K, V or Q stage read while it holds another block or is
being loaded; and on a tile whose blocks a warpgroup did not see exactly.
The old rule (a skipped V stage freed by the leader right after its own
wait, with no meeting of the warpgroup) must fail here, and so must the
other mutations: the model is not vacuous. Keep it in step with the
kernel.
"""

import random

import pytest


class ProtocolError(Exception):
    pass


class _MBar:
    """An mbarrier: `count` arrivals (and the expected bytes) end a phase."""

    def __init__(self, name, count):
        self.name, self.count, self.arrived, self.tx, self.done = name, count, 0, 0, 0

    def _check(self):
        if self.arrived == self.count and self.tx == 0:
            self.arrived = 0
            self.done += 1

    def arrive(self, expect_tx=0):
        self.arrived += 1
        self.tx += expect_tx
        if self.arrived > self.count:
            raise ProtocolError(f"{self.name}: more arrivals than its count")
        self._check()

    def complete_tx(self):
        self.tx -= 1
        self._check()


def _wait(bar, phase, who):
    """Wait by parity for phase `phase` of bar: only sound while the barrier
    has completed `phase` or `phase + 1` phases (one phase behind it would
    pass at once, two ahead it would wait for good)."""
    while True:
        if bar.done not in (phase, phase + 1):
            raise ProtocolError(
                f"{who}: parity alias on {bar.name}: {bar.done} phases done, "
                f"waiting for phase {phase}")
        if bar.done == phase + 1:
            return
        yield False


class _Named:
    """A named barrier (bar.sync / bar.arrive), counted in warps."""

    def __init__(self, name, warps):
        self.name, self.warps, self.count, self.gen = name, warps, 0, 0

    def arrive(self):
        self.count += 1
        if self.count == self.warps:
            self.count = 0
            self.gen += 1

    def sync(self):
        gen = self.gen
        self.arrive()
        while self.gen == gen:
            yield False


class _Pipe:
    def __init__(self, stages):
        self.stages, self.n = stages, 0

    @property
    def stage(self):
        return self.n % self.stages

    @property
    def rnd(self):
        return self.n // self.stages


def union_of(rows):
    """The producer's merge (sk90_pair_next): sorted union, per block the
    rows that selected it."""
    blocks = sorted(set(rows[0]) | set(rows[1]))
    return [(c, tuple(h for h in (0, 1) if c in rows[h])) for c in blocks]


def run_protocol(tiles, kstages, vstages, rng, mutation=None):
    """One CTA's tiles (each a pair of rows' block lists) through the
    protocol. mutation: a rule broken on purpose (the tests below)."""
    k_full = [_MBar(f"K full {s}", 1) for s in range(kstages)]
    k_empty = [_MBar(f"K empty {s}", 8) for s in range(kstages)]
    v_full = [_MBar(f"V full {s}", 1) for s in range(vstages)]
    v_empty = [_MBar(f"V empty {s}", 2) for s in range(vstages)]
    q_full, q_empty = _MBar("Q full", 1), _MBar("Q empty", 2)
    t_full = [_MBar(f"tile full {s}", 1) for s in range(2)]
    t_empty = [_MBar(f"tile empty {s}", 8) for s in range(2)]  # 256 threads
    turn = [_Named("turn 0", 8), _Named("turn 1", 8)]
    own = [_Named("warpgroup 0", 4), _Named("warpgroup 1", 4)]  # epilogue ids
    info = [None] * kstages  # block_info: (tile, j, c, sel, more)
    k_data = [None] * kstages  # what a stage holds; "loading" while in flight
    v_data = [None] * vstages
    q_data = [None]
    tile_ids = [None, None]
    tx = []  # loads in flight: (barrier, data list, index, value)
    gemm = [0, 0]  # per warpgroup, GEMM turns issued (a warp each)
    issued_by = {(wg, w): [0] for wg in (0, 1) for w in range(4)}
    seen = {(u, h, w): [] for u in range(len(tiles)) for h in (0, 1) for w in range(4)}

    def load(bar, data, idx, value):
        data[idx] = "loading"
        bar.arrive(expect_tx=1)
        tx.append((bar, data, idx, value))

    def producer():
        kp, vp = _Pipe(kstages), _Pipe(vstages)
        qn = 0
        for n, rows in enumerate(tiles + [None]):
            slot = n % 2
            if n >= 2:
                yield from _wait(t_empty[slot], n // 2 - 1, "producer tile empty")
            blocks = union_of(rows) if rows is not None else []
            tile_ids[slot] = ("end",) if rows is None else (n, bool(blocks))
            t_full[slot].arrive()
            yield True
            if rows is None:
                return
            if not blocks:
                continue
            if qn > 0:
                yield from _wait(q_empty, qn - 1, "producer Q empty")
            load(q_full, q_data, 0, n)
            qn += 1

            def put_k(j):
                if kp.rnd > 0:
                    yield from _wait(k_empty[kp.stage], kp.rnd - 1, "producer K empty")
                c, sel = blocks[j]
                info[kp.stage] = (n, j, c, sel, j + 1 < len(blocks))
                load(k_full[kp.stage], k_data, kp.stage, (n, j))
                kp.n += 1
                yield True

            def put_v(j):
                if vp.rnd > 0:
                    yield from _wait(v_empty[vp.stage], vp.rnd - 1, "producer V empty")
                load(v_full[vp.stage], v_data, vp.stage, (n, j))
                vp.n += 1
                yield True

            yield from put_k(0)
            for j in range(len(blocks)):
                if j + 1 < len(blocks):
                    yield from put_k(j + 1)
                yield from put_v(j)

    def check(data, idx, want, what, who):
        if data[idx] != want:
            raise ProtocolError(f"{who} read {what} stage {idx} holding {data[idx]}, wanted {want}")

    def walk(wg, warp, u, kp, vp):
        """sk90_pair_walk, one warp's view."""
        who = f"warpgroup {wg} warp {warp}"
        leader = warp == 0
        more, prev_mine, has_prev = True, False, False
        issued = issued_by[(wg, warp)]
        j = 0
        while True:
            cur, mine, last = None, False, False
            if more:
                yield from _wait(k_full[kp.stage], kp.rnd, who + " K full")
                cur = info[kp.stage]
                if cur[:2] != (u, j):
                    raise ProtocolError(f"{who} read block info {cur[:2]} for {(u, j)}")
                mine = wg in cur[3]
                last = j == 0 if mutation == "q_at_first" else not cur[4]
            if prev_mine:
                yield from _wait(v_full[vp.stage], vp.rnd, who + " V full")
            yield from turn[wg].sync()
            # The GEMMs are issued here by all four warps (the sync holds
            # them) and complete as one warpgroup operation, so a stage is
            # read from the issue to the first warp's wait: checked here.
            if mine:
                check(k_data, kp.stage, (u, j), "K", who)
                check(q_data, 0, u, "Q", who)
                seen[(u, wg, warp)].append(cur[2])
            if prev_mine:
                check(v_data, vp.stage, (u, j - 1), "V", who)
            turn[1 - wg].arrive()
            yield True
            if mine or prev_mine:  # the wgmma waits: all four warps issued
                gemm[wg] += 1
                issued[0] += 1
                while gemm[wg] < 4 * issued[0]:
                    yield False
            if mine:  # S_j done: K (and, at the last block, Q) free
                yield from _release_k(kp, who)
                if leader and last:
                    q_empty.arrive()
                yield True
            if prev_mine:  # P_{j-1} V_{j-1} done
                if leader:
                    v_empty[vp.stage].arrive()
                yield True
            if more and not mine:
                yield from _release_k(kp, who)
                if leader and last:
                    q_empty.arrive()
            if has_prev and not prev_mine:
                yield from _wait(v_full[vp.stage], vp.rnd, who + " V full (skipped)")
                if mutation != "no_warpgroup_sync":
                    yield from own[wg].sync()
                if leader and mutation != "skipped_kept":
                    v_empty[vp.stage].arrive()
            if has_prev:
                vp.n += 1
            if not more:
                return
            kp.n += 1
            has_prev, prev_mine, j = True, mine, j + 1
            more = cur[4]

    def _release_k(kp, who):
        k_empty[kp.stage].arrive()
        yield True

    def consumer(wg, warp):
        kp, vp = _Pipe(kstages), _Pipe(vstages)
        qn = 0
        if wg == 1:
            turn[0].arrive()  # consumer 0 issues first
        for n in range(len(tiles) + 1):
            slot = n % 2
            yield from _wait(t_full[slot], n // 2, f"warpgroup {wg} tile full")
            value = tile_ids[slot]
            t_empty[slot].arrive()
            if value == ("end",):
                break
            u, has_blocks = value
            if u != n:
                raise ProtocolError(f"warpgroup {wg} read tile {u} for {n}")
            if has_blocks:
                yield from _wait(q_full, qn, f"warpgroup {wg} Q full")
                check(q_data, 0, u, "Q", f"warpgroup {wg}")
                qn += 1
                yield from walk(wg, warp, u, kp, vp)
            for _ in range(2):  # the epilogue's two meetings
                yield from own[wg].sync()
        if wg == 0:
            yield from turn[0].sync()  # consumer 1's last arrival

    def tma():
        while True:
            if tx:
                bar, data, idx, value = tx.pop(rng.randrange(len(tx)) if rng.random() < 0.3 else 0)
                data[idx] = value
                bar.complete_tx()
                yield True
            else:
                yield False

    actors = [producer()] + [consumer(wg, w) for wg in (0, 1) for w in range(4)]
    speed = [rng.choice((1, 1, 2, 6, 20)) for _ in actors] + [rng.choice((1, 3, 8))]
    engine = tma()
    live = list(range(len(actors)))
    idle = 0
    while live:
        weights = [1.0 / speed[i] for i in live] + [1.0 / speed[-1]]
        pick = rng.choices(range(len(live) + 1), weights)[0]
        if pick == len(live):
            progressed = next(engine)
        else:
            try:
                progressed = next(actors[live[pick]])
            except StopIteration:
                live.pop(pick)
                progressed = True
        idle = 0 if progressed else idle + 1
        if idle > 400 * (len(live) + 1):
            raise ProtocolError(f"deadlock: {len(live)} actors blocked, {len(tx)} loads in flight")
    for u, rows in enumerate(tiles):
        for h in (0, 1):
            for w in range(4):
                if seen[(u, h, w)] != sorted(rows[h]):
                    raise ProtocolError(
                        f"tile {u} row {h} warp {w}: computed {seen[(u, h, w)]}, wanted {rows[h]}")


def random_tiles(rng, count, cols=32, pick=8):
    tiles = []
    for _ in range(count):
        rows = []
        for _ in range(2):
            kind = rng.random()
            if kind < 0.15:
                rows.append([])  # an empty row
            elif kind < 0.3:
                rows.append(sorted(rng.sample(range(cols), rng.choice((1, 3, 5)))))
            else:
                rows.append(sorted(rng.sample(range(cols), pick)))
        if rng.random() < 0.2:
            rows[1] = list(rows[0])  # partner rows that agree
        tiles.append(rows)
    return tiles


# K / V stages: BN = 128 at D = 128 (2 + 2), BN = 64 at D = 128 (4 + 4),
# D = 64 (3 + 3; 6 + 6 at BN = 64).
STAGES = [(2, 2), (4, 4), (3, 3), (6, 6)]


@pytest.mark.parametrize("kstages,vstages", STAGES)
def test_pair_protocol_random(kstages, vstages):
    for seed in range(30):
        rng = random.Random(1000 * kstages + seed)
        tiles = random_tiles(rng, rng.randrange(1, 12))
        try:
            run_protocol(tiles, kstages, vstages, rng)
        except ProtocolError as e:
            raise AssertionError(f"seed {seed}, stages {kstages} + {vstages}: {e}") from e


def test_pair_protocol_edge_tiles():
    rng = random.Random(7)
    cases = [
        [[[], []]],  # one empty tile
        [[[0], []], [[], [0]], [[], []], [[1], [1]]],
        [[list(range(32)), []], [[], list(range(32))]],  # one row does it all
        [[[c] for c in (3, 9)]] * 6,
    ]
    for tiles in cases:
        for _ in range(20):
            run_protocol(tiles, 2, 2, rng)


def _fails(mutation, kstages=2, vstages=2, seeds=300):
    for seed in range(seeds):
        rng = random.Random(seed)
        tiles = random_tiles(rng, rng.randrange(2, 12))
        try:
            run_protocol(tiles, kstages, vstages, rng, mutation)
        except ProtocolError:
            return True
    return False


@pytest.mark.parametrize("kstages,vstages", [(2, 2), (4, 4)])
def test_old_rule_fails(kstages, vstages):
    """The rule before the fix (the leader frees a skipped V stage right
    after its own wait) lets a lagging warp reach its wait when the stage
    has been refilled and landed: two phases ahead, the wait would last for
    good (the watchdog's "V full" of a warp of one warpgroup while the TMA
    warp waits for that warp's K release). The model must find it at
    2 + 2 stages (BN = 128, D = 128, where the GPU hangs) and at 4 + 4
    (BN = 64: rarer on the GPU, the same flaw)."""
    assert _fails("no_warpgroup_sync", kstages, vstages)


def test_q_released_early_fails():
    """Q freed after a tile's first block instead of its last: the next
    tile's Q lands under a later S GEMM (a stage read while loading)."""
    assert _fails("q_at_first")


def test_skipped_stage_kept_deadlocks():
    """A skipped V stage never freed: the producer waits for it for good."""
    with pytest.raises(ProtocolError, match="deadlock"):
        rng = random.Random(3)
        run_protocol([[[1, 2, 3], [4]]] * 4, 2, 2, rng, "skipped_kept")
