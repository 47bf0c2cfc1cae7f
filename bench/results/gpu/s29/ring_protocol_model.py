# Session 29: a model of the paired-tile kernel's ring and turn protocol
# (prefill_pair_tiles_experiment.diff): the copying warpgroup, the two
# computing warpgroups with their turns, the full / empty barriers as
# phase counts, random interleavings. Checks no deadlock, the copier never
# more than one phase behind a slot, and turns balanced, for 1-7 key tiles
# a row tile, one or two row tiles. With the one-tile release rule
# (t + 2 < nt) it deadlocks 46 of 56 paired cases. python3 ring_protocol_model.py
# Protocol model of the paired-tile ws kernel: copier, two computing warpgroups with turns.
import itertools, random
def sim(nts, S, seed):
    rnd = random.Random(seed)
    nt_all = sum(nts); items = 2 * nt_all
    full = [0]*S; empty = [0]*S; empty_cnt = [0]*S  # completed phases; arrivals in current phase
    bar = {1: 0, 2: 0}  # arrivals
    waited = {0: 0, 1: 0}  # my_turn passes per warpgroup
    def release(i):
        st = i % S
        empty_cnt[st] += 4  # one warpgroup's four warps
        if empty_cnt[st] == 8:
            empty_cnt[st] = 0; empty[st] += 1
    # copier as generator
    def copier():
        for i in range(items):
            st = i % S
            if i >= S:
                while empty[st] < i // S: yield
                assert empty[st] == i // S, ("ahead", i, empty[st])
            full[st] += 1
            yield
    def compute(cw):
        def my_turn():
            # bar.sync(1+cw): wait for arrivals on bar 1+cw beyond our passes
            while bar[1 + cw] <= waited[cw]: yield
            waited[cw] += 1
        def your_turn(): bar[2 - cw] += 1
        if nt_all > 0 and cw == 1: your_turn()
        base = 0; rest = nt_all
        for u, nt in enumerate(nts):
            for t in range(nt):
                first = t == 0
                for i in ([base + 2*t] if first else [base + 2*t, base + 2*t - 1]):
                    while full[i % S] < i // S + 1: yield
                yield from my_turn()
                your_turn()
                yield
                release(base + 2*t)
                if not first and t + 2 < rest: release(base + 2*t - 1)
                yield
            if nt > 0:
                i = base + 2*nt - 1
                while full[i % S] < i // S + 1: yield
                yield from my_turn()
                if cw == 0 or u + 1 < len(nts): your_turn()
                if nt + 2 < rest: release(i)
            base += 2*nt; rest -= nt
    gens = [copier(), compute(0), compute(1)]
    done = [False]*3; steps = 0
    while not all(done):
        k = rnd.randrange(3)
        if done[k]: continue
        try: next(gens[k])
        except StopIteration: done[k] = True
        steps += 1
        if steps > 10**6: return "deadlock"
    # every barrier: arrivals == passes
    if bar[1] != waited[0] or bar[2] != waited[1]: return f"turn mismatch {bar} {waited}"
    return "ok"
bad = 0
for S in (5, 6):
    for nts in itertools.chain(([a] for a in range(1, 8)), ([a, b] for a in range(1, 8) for b in range(1, 8))):
        if S == 6 and len(nts) == 2: continue
        for seed in range(20):
            r = sim(nts, S, seed)
            if r != "ok": bad += 1; print(S, nts, seed, r); break
print("bad", bad)
